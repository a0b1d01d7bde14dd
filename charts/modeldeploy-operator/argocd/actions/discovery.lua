-- Argo CD resource actions of a ModelDeployment: which of them apply to the object as it is now.
-- Each action only sets an annotation the operator acts on once and then removes (never spec, which
-- git owns), the same as `modeldeploy rollout promote|abort|rollback`.
--   promote      a canary is running or a step waits for a human (phase Canary)
--   abort        a rollout is under way: back to the stable bundle, the canary's bundle held as failed
--   rollback-to  status.history has a prior bundle; parameter `bundle` (default: the newest entry)
local actions = {}
local st = obj.status or {}
local phase = st.phase or ""
local rolling = phase == "Prefetching" or phase == "Deploying" or phase == "Verifying" or
  phase == "Canary" or phase == "Promoting"
local history = st.history or {}
actions["promote"] = { ["disabled"] = phase ~= "Canary", ["iconClass"] = "fa fa-fw fa-forward" }
actions["abort"] = { ["disabled"] = not rolling, ["iconClass"] = "fa fa-fw fa-times-circle" }
actions["rollback-to"] = {
  ["disabled"] = #history == 0,
  ["iconClass"] = "fa fa-fw fa-undo",
  ["params"] = { { ["name"] = "bundle" } },
}
return actions
