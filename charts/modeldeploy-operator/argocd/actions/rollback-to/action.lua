-- rollback-to: serve a bundle from status.history again. Parameter `bundle` (a bundle id); without
-- it, the newest history entry. A bundle that is not in the history is refused here, by name.
local wanted = nil
if actionParams ~= nil and actionParams["bundle"] ~= nil and actionParams["bundle"] ~= "" then
  wanted = actionParams["bundle"]
end
local history = {}
if obj.status ~= nil and obj.status.history ~= nil then
  history = obj.status.history
end
if #history == 0 then
  error("status.history is empty: no prior bundle to roll back to", 0)
end
local target = nil
local known = {}
for _, h in ipairs(history) do
  if h.bundle ~= nil then
    table.insert(known, h.bundle)
    if wanted == nil or h.bundle == wanted then
      target = h.bundle
    end
  end
end
if target == nil then
  error("bundle " .. wanted .. " is not in status.history; choose one of: " .. table.concat(known, ", "), 0)
end
if obj.metadata.annotations == nil then
  obj.metadata.annotations = {}
end
obj.metadata.annotations["modeldeploy.dev/rollback-to"] = target
return obj
