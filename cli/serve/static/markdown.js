// A small Markdown renderer for model replies that never turns model text into HTML: every element is
// made with createElement and every piece of text goes in through a text node, so `<img onerror>` or a
// `<script>` in a reply shows as the characters it is. Links keep only http(s) and mailto targets
// (`javascript:` and `data:` links stay plain text); images are never loaded, they become links.
// Blocks: fenced code (``` or ~~~, unclosed while streaming), headings, lists, quotes, rules,
// paragraphs. Inline: `code`, **bold**, *italic*, ~~strike~~, [links](url), bare http(s) URLs.
"use strict";

(() => {
  const SAFE_PROTOCOLS = new Set(["http:", "https:", "mailto:"]);
  const INLINE = new RegExp(
    [
      "(`+)([^`]|[^`][\\s\\S]*?[^`])\\1(?!`)", // 1,2 code span
      "\\*\\*(?=\\S)([\\s\\S]*?\\S)\\*\\*", // 3 bold
      "\\*(?=[^\\s*])([^*\\n]*?[^\\s*])\\*", // 4 italic
      "~~(?=\\S)([\\s\\S]*?\\S)~~", // 5 strike
      "(!?)\\[([^\\]\\n]*)\\]\\(\\s*<?([^)\\s>]*)>?(?:\\s+\"[^\"\\n]*\")?\\s*\\)", // 6,7,8 link/image
      "(https?:\\/\\/[^\\s<>()\\[\\]]*[^\\s<>()\\[\\].,;:!?'\"])", // 9 bare URL
    ].join("|"),
    "g",
  );

  /** The URL if it is http(s) or mailto (resolved against the page), otherwise null. */
  function safeUrl(href) {
    try {
      const url = new URL(href, window.location.href);
      return SAFE_PROTOCOLS.has(url.protocol) ? url.href : null;
    } catch {
      return null;
    }
  }

  function el(tag, className) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    return node;
  }

  function link(href, text) {
    const a = el("a");
    a.href = href;
    a.rel = "noopener noreferrer nofollow";
    a.target = "_blank";
    a.textContent = text;
    return a;
  }

  /** Inline Markdown of `text` appended to `parent`, as text nodes and safe elements only. */
  function inline(parent, text) {
    let last = 0;
    INLINE.lastIndex = 0;
    for (let m = INLINE.exec(text); m !== null; m = INLINE.exec(text)) {
      if (m.index > last) parent.append(document.createTextNode(text.slice(last, m.index)));
      last = INLINE.lastIndex;
      if (m[2] !== undefined) {
        const code = el("code");
        code.textContent = m[2];
        parent.append(code);
      } else if (m[3] !== undefined) {
        inline(parent.appendChild(el("strong")), m[3]);
      } else if (m[4] !== undefined) {
        inline(parent.appendChild(el("em")), m[4]);
      } else if (m[5] !== undefined) {
        inline(parent.appendChild(el("del")), m[5]);
      } else if (m[7] !== undefined) {
        const href = safeUrl(m[8]);
        const label = m[6] ? `image: ${m[7] || m[8]}` : m[7] || m[8];
        parent.append(href ? link(href, label) : document.createTextNode(m[0]));
      } else if (m[9] !== undefined) {
        const href = safeUrl(m[9]);
        parent.append(href ? link(href, m[9]) : document.createTextNode(m[9]));
      }
    }
    if (last < text.length) parent.append(document.createTextNode(text.slice(last)));
  }

  function codeBlock(lang, lines) {
    const wrap = el("div", "code-block");
    const bar = el("div", "code-bar");
    const name = el("span", "code-lang");
    name.textContent = lang || "text";
    const copy = el("button", "copy");
    copy.type = "button";
    copy.textContent = "Copy";
    copy.setAttribute("aria-label", `Copy ${lang || "code"}`);
    const pre = el("pre");
    const code = el("code");
    code.textContent = lines.join("\n");
    copy.addEventListener("click", () => {
      navigator.clipboard?.writeText(code.textContent).then(
        () => (copy.textContent = "Copied"),
        () => (copy.textContent = "Copy failed"),
      );
    });
    bar.append(name, copy);
    pre.append(code);
    wrap.append(bar, pre);
    return wrap;
  }

  const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([^\s`]*)/;
  const HEADING = /^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
  const RULE = /^ {0,3}([-*_])(?:\s*\1){2,}\s*$/;
  const QUOTE = /^ {0,3}>\s?(.*)$/;
  const ITEM = /^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/;

  /** Block Markdown of `text` as a DocumentFragment. */
  function render(text) {
    const out = document.createDocumentFragment();
    const lines = String(text).replace(/\r\n?/g, "\n").split("\n");
    let i = 0;
    while (i < lines.length) {
      const line = lines[i];
      const fence = FENCE.exec(line);
      if (fence) {
        const body = [];
        i += 1;
        while (i < lines.length && !lines[i].trim().startsWith(fence[1])) body.push(lines[i++]);
        i += 1; // the closing fence (or past the end while a reply is still streaming)
        out.append(codeBlock(fence[2], body));
        continue;
      }
      if (!line.trim()) {
        i += 1;
        continue;
      }
      const heading = HEADING.exec(line);
      if (heading) {
        inline(out.appendChild(el(`h${Math.min(heading[1].length + 2, 6)}`)), heading[2]);
        i += 1;
        continue;
      }
      if (RULE.test(line)) {
        out.append(el("hr"));
        i += 1;
        continue;
      }
      if (QUOTE.test(line)) {
        const body = [];
        while (i < lines.length && QUOTE.test(lines[i])) body.push(QUOTE.exec(lines[i++])[1]);
        out.appendChild(el("blockquote")).append(render(body.join("\n")));
        continue;
      }
      const item = ITEM.exec(line);
      if (item) {
        const ordered = /\d/.test(item[2]);
        const list = el(ordered ? "ol" : "ul");
        if (ordered && parseInt(item[2], 10) !== 1) list.start = parseInt(item[2], 10);
        let current = null;
        while (i < lines.length) {
          const next = ITEM.exec(lines[i]);
          if (next && /\d/.test(next[2]) === ordered) {
            current = list.appendChild(el("li"));
            if (next[1].length >= 2) current.className = "nested";
            inline(current, next[3]);
          } else if (lines[i].trim() && /^\s+/.test(lines[i]) && current) {
            current.append(document.createTextNode("\n"));
            inline(current, lines[i].trim());
          } else {
            break;
          }
          i += 1;
        }
        out.append(list);
        continue;
      }
      const para = [];
      while (
        i < lines.length &&
        lines[i].trim() &&
        !FENCE.test(lines[i]) &&
        !HEADING.test(lines[i]) &&
        !QUOTE.test(lines[i]) &&
        !ITEM.test(lines[i]) &&
        !RULE.test(lines[i])
      ) {
        para.push(lines[i++]);
      }
      inline(out.appendChild(el("p")), para.join("\n"));
    }
    return out;
  }

  window.inferMarkdown = Object.freeze({ render, safeUrl });
})();
