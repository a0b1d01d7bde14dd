-- Argo CD health of a ModelDeployment (serving.modeldeploy.dev/v1alpha1), read from its status.
-- Rules, first match wins:
--   Progressing  no status yet, or status.observedGeneration < metadata.generation (the
--                operator has not acted on the latest spec: never report a stale Healthy)
--   Degraded     phase Degraded, or condition Degraded=True (e.g. a bundle rolled back, or
--                Unschedulable); a failed rollout stays Degraded until spec.bundle changes
--   Suspended    phase Canary and condition Progressing has reason Paused or
--                AwaitingPromotion: a canary step held for a human (`modeldeploy rollout promote`)
--   Progressing  phase Prefetching, Deploying, Verifying, Canary, Promoting or RollingBack; a Replace rollout waiting
--                for GPUs (Progressing reason InsufficientCapacity) says "Waiting for capacity" first
--   Healthy      condition Ready=True
--   Progressing  otherwise (Ready False/absent: replicas still loading weights)
local hs = {}

local function condition(st, ctype)
  if st.conditions == nil then
    return nil
  end
  for _, c in ipairs(st.conditions) do
    if c.type == ctype then
      return c
    end
  end
  return nil
end

local function said(c)
  if c == nil then
    return ""
  end
  local m = c.reason or ""
  if c.message ~= nil and c.message ~= "" then
    m = m .. ": " .. c.message
  end
  return m
end

local function cohort(c)
  if c == nil then
    return "none"
  end
  return (c.bundle or "?") .. " " .. tostring(c.readyReplicas or 0) .. "/" .. tostring(c.replicas or 0) .. " ready"
end

local st = obj.status
if st == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to report status"
  return hs
end

local gen = obj.metadata and obj.metadata.generation
if gen ~= nil and (st.observedGeneration == nil or st.observedGeneration < gen) then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe generation " .. tostring(gen) ..
    " (status is for " .. tostring(st.observedGeneration or "none") .. ")"
  return hs
end

local phase = st.phase or ""
local degraded = condition(st, "Degraded")
if phase == "Degraded" or (degraded ~= nil and degraded.status == "True") then
  hs.status = "Degraded"
  hs.message = said(degraded)
  if hs.message == "" then
    hs.message = "Phase Degraded"
  end
  return hs
end

local progressing = condition(st, "Progressing")
local step = ""
if st.currentStep ~= nil then
  step = " step " .. tostring(st.currentStep + 1)
end
local canary = " canary " .. cohort(st.canary) .. " at " .. tostring(st.canaryWeight or 0) .. "%" .. step
if phase == "Canary" and progressing ~= nil and
    (progressing.reason == "Paused" or progressing.reason == "AwaitingPromotion") then
  hs.status = "Suspended"
  hs.message = "Canary paused:" .. canary .. " (" .. said(progressing) ..
    "); continue with `modeldeploy rollout promote`"
  return hs
end

if phase == "Prefetching" or phase == "Deploying" or phase == "Verifying" or phase == "Canary" or phase == "Promoting" or
    phase == "RollingBack" then
  hs.status = "Progressing"
  hs.message = phase .. ":" .. canary .. "; stable " .. cohort(st.stable)
  if progressing ~= nil and progressing.reason == "InsufficientCapacity" then
    hs.message = "Waiting for capacity: " .. hs.message
  end
  if progressing ~= nil then
    hs.message = hs.message .. " (" .. said(progressing) .. ")"
  end
  return hs
end

local ready = condition(st, "Ready")
if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = "Stable " .. cohort(st.stable)
  return hs
end
hs.status = "Progressing"
if ready ~= nil then
  hs.message = "Not ready: " .. said(ready)
else
  hs.message = "Waiting for the Ready condition"
end
return hs
