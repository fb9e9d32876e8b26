"""The floor every layer stands on: nothing here knows a dataset, a model or a method.

Safe file writes, the JSON reader and JSON logs (files, jsonlog), locks, provenance manifests and run ids
(manifest), code identity (codedeps: a step's import closure and its digest), the by-name registries a new method
family, loss, dataset kind or noise model joins (registry), params checking against a JSON schema (schema) and
glibc's heap set to keep the memory a step frees (heap).
"""
