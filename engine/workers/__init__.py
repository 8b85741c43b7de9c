"""Worker processes for hostile input: code that can loop, recurse, allocate without end or crash in
native code (chat templates, grammars) runs in a child process the parent can kill, under a time,
memory and optional CPU bound, so a failure costs one request and never the server.

`process.py` is the parent side (:class:`WorkerProcess`), `serve.py` the child's loop (standard library
only, run as a script); each kind of work is a *handler* module the child loads by path
(``engine/text/template_worker.py``, ``engine/grammar/compile_worker.py``).
"""

from infer.engine.workers.process import WorkerFailure, WorkerLimits, WorkerProcess

__all__ = ["WorkerFailure", "WorkerLimits", "WorkerProcess"]
