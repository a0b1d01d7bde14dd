-- abort: the operator moves traffic back to the stable bundle and removes the canary; the aborted
-- bundle is held as failed until spec.bundle changes in git.
local os = require("os")
if obj.metadata.annotations == nil then
  obj.metadata.annotations = {}
end
obj.metadata.annotations["modeldeploy.dev/abort"] = os.date("!%Y-%m-%dT%XZ")
return obj
