"""ModelDeployment API types, serving.modeldeploy.dev/v1alpha1: the single source of truth of the schema.

One concept a module: `modeldeployment` (the object, its spec, GROUP/VERSION/KIND), `bundle`,
`topology`, `rollout`, `analysis`, `status` and `common` (shared checks). Import a name from the
module that defines it. May import pydantic only: nothing else of the operator.
"""
