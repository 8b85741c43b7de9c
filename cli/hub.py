"""Models from the Hugging Face hub by name: `hf://OWNER/REPO[/FILE.gguf]`, through `huggingface_hub`.

Downloads go to huggingface_hub's own cache (`HF_HOME`, `HF_HUB_CACHE`), so its resume, auth
(`HF_TOKEN`), offline mode (`HF_HUB_OFFLINE`) and endpoint (`HF_ENDPOINT`) apply, and a model already
fetched by another tool is reused. Only asked-for names reach the hub; `huggingface_hub` is imported
here, on first use.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

HF_PREFIX = "hf://"


class HubError(Exception):
    """A hub name is malformed, or its download failed; the message says which and what to do."""


@dataclass(frozen=True)
class HubRef:
    """A model on the hub: a repository and, optionally, the GGUF file in it."""

    repo_id: str
    """`OWNER/REPO`."""
    filename: str | None
    """Path of the GGUF inside the repository; None = the repository's only GGUF."""

    @classmethod
    def parse(cls, text: str) -> HubRef:
        """`hf://OWNER/REPO` or `hf://OWNER/REPO/PATH/FILE.gguf`."""
        parts = [part for part in text.removeprefix(HF_PREFIX).split("/") if part]
        if not text.startswith(HF_PREFIX) or len(parts) < 2:
            raise HubError(f"{text!r}: a hub model is hf://OWNER/REPO or hf://OWNER/REPO/FILE.gguf")
        filename = "/".join(parts[2:]) or None
        if filename is not None and not filename.endswith(".gguf"):
            raise HubError(f"{text!r}: infer reads GGUF files from the hub; name a .gguf file")
        return cls(repo_id="/".join(parts[:2]), filename=filename)

    def __str__(self) -> str:
        return HF_PREFIX + self.repo_id + (f"/{self.filename}" if self.filename else "")


def is_hub_name(text: str | None) -> bool:
    """Whether a `model` setting names a hub model."""
    return text is not None and text.startswith(HF_PREFIX)


def _only_gguf(repo_id: str, files: list[str]) -> str:
    ggufs = sorted(name for name in files if name.endswith(".gguf"))
    if len(ggufs) == 1:
        return ggufs[0]
    if not ggufs:
        raise HubError(f"hf://{repo_id} holds no GGUF file; infer reads GGUF from the hub")
    shown = ", ".join(ggufs[:6]) + (", ..." if len(ggufs) > 6 else "")
    raise HubError(f"hf://{repo_id} holds {len(ggufs)} GGUF files; name one: hf://{repo_id}/FILE ({shown})")


def _explain(ref: HubRef, exc: Exception) -> HubError:
    """A one-line reason for a failed hub call."""
    from huggingface_hub import constants
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    if isinstance(exc, GatedRepoError):
        return HubError(f"{ref}: the repository is gated: accept its terms on the hub and set HF_TOKEN")
    if isinstance(exc, RepositoryNotFoundError):
        return HubError(f"{ref}: no such repository on {constants.ENDPOINT} (or it is private: set HF_TOKEN)")
    if isinstance(exc, LocalEntryNotFoundError) or "connect" in type(exc).__name__.lower():
        return _offline(ref, constants.ENDPOINT)
    if isinstance(exc, EntryNotFoundError):
        return HubError(f"{ref}: no such file in hf://{ref.repo_id}")
    if isinstance(exc, HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else "?"
        return HubError(f"{ref}: the hub answered HTTP {status}")
    return HubError(f"{ref}: {type(exc).__name__}: {exc}")


def _offline(ref: HubRef, endpoint: str) -> HubError:
    return HubError(
        f"{ref}: cannot reach {endpoint} and the file is not in the hub cache: no network? "
        "Download the GGUF elsewhere and pass --model PATH"
    )


def _reachable(endpoint: str) -> bool:
    """Whether the hub's host accepts a TCP connection within 3 s. huggingface_hub retries a refused
    connection for about 23 s with a warning each time; this answers an offline machine at once.
    Behind a proxy the proxy decides, so then the answer is yes."""
    if any(os.environ.get(name) for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy")):
        return True
    url = urlparse(endpoint)
    try:
        port = url.port or (443 if url.scheme == "https" else 80)
        socket.create_connection((url.hostname or "", port), timeout=3).close()
    except (OSError, ValueError):
        return False
    return True


def hub_download(ref: HubRef) -> Path:
    """The local path of `ref`'s GGUF, downloaded into the hub cache if needed (huggingface_hub shows
    its byte progress bar on stderr); offline, the cached copy if there is one. Raises `HubError`."""
    from huggingface_hub import constants, hf_hub_download, list_repo_files

    if constants.HF_HUB_OFFLINE or not _reachable(constants.ENDPOINT):
        if ref.filename is not None:
            try:
                return Path(hf_hub_download(ref.repo_id, ref.filename, local_files_only=True))
            except Exception:  # not cached: say what to do instead
                pass
        raise _offline(ref, constants.ENDPOINT)
    try:
        filename = ref.filename or _only_gguf(ref.repo_id, list_repo_files(ref.repo_id))
        return Path(hf_hub_download(ref.repo_id, filename))
    except HubError:
        raise
    except Exception as exc:  # huggingface_hub raises its own errors and the HTTP client's
        raise _explain(ref, exc) from None


def cached_hub_models() -> list[tuple[str, Path, int]]:
    """(hf://OWNER/REPO/FILE.gguf, path, size) for each GGUF in the hub cache; [] if there is none."""
    from huggingface_hub import constants

    if not Path(constants.HF_HUB_CACHE).is_dir():
        return []
    from huggingface_hub import scan_cache_dir

    rows: list[tuple[str, Path, int]] = []
    for repo in scan_cache_dir().repos:
        if repo.repo_type != "model":
            continue
        for revision in repo.revisions:
            for file in revision.files:
                if file.file_name.endswith(".gguf"):
                    inside = file.file_path.relative_to(revision.snapshot_path).as_posix()
                    rows.append((f"{HF_PREFIX}{repo.repo_id}/{inside}", file.file_path, file.size_on_disk))
    return sorted(set(rows))
