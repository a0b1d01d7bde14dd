-- promote: the operator completes the current canary step (a paused or manual step resumes).
local os = require("os")
if obj.metadata.annotations == nil then
  obj.metadata.annotations = {}
end
obj.metadata.annotations["modeldeploy.dev/promote"] = os.date("!%Y-%m-%dT%XZ")
return obj
