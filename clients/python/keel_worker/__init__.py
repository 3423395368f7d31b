"""keel-worker: run keel training jobs from Python.

    from keel_worker import Worker, RetryableError, Blocked

    def train(job):
        if job.stop_requested.is_set():
            return None                        # reports user-stopped
        return {"adapter": "acme/bot"}         # the succeeded report's result

    Worker("http://keel:8080", internal_key, "gpu-node-7", ["training"], train).run()
"""

from ._worker import MAX_TEXT, Blocked, DatasetMismatch, Handler, Job, KeelError, RetryableError, Worker

__all__ = ["Worker", "Job", "Handler", "RetryableError", "Blocked", "KeelError", "DatasetMismatch", "MAX_TEXT"]
__version__ = "0.1.0"
