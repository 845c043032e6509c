"""A grammar compile worker's entry point: ``python -m radixlm.runtime.constrained.worker_main``
(started by ``compile_worker.CompileWorkers``; a module of its own, so that running it
does not re-import the module that defines it)."""

from radixlm.runtime.constrained.compile_worker import serve

if __name__ == "__main__":
    serve()
