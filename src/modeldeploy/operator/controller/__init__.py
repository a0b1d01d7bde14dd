"""The reconcile loop's machinery: everything that talks to the API server or keeps state between passes.

Owns the Controller (`reconciler`), the API client (`kube`), the watch-fed store, the work queue,
GPU claims, peering, observe (read the world) and apply (execute actions), the operator's metrics
and tracing. May import every other operator package; nothing below it imports this one.
"""
