"""LLMEngine: the synchronous engine: add requests, `step()` until done.

One step = schedule -> one forward over the mixed batch -> sample -> detokenize ->
finish. `LLM` (offline), `AsyncEngine` and `EngineCore` (server) are thin loops around it.
"""

from __future__ import annotations

import dataclasses
import time
import weakref
from collections.abc import Callable

import torch

from modeldeploy.kernels import dispatch, quant
from modeldeploy.runtime.config import EngineConfig
from modeldeploy.runtime.engine.core.block_manager import BlockManager
from modeldeploy.runtime.engine.core.kv_budget import (
    auto_blocks,
    available_memory_bytes,
    cpu_kv_budget,
    fit_max_model_len,
)
from modeldeploy.runtime.engine.core.scheduler import PrefillCost, ScheduledBatch, Scheduler
from modeldeploy.runtime.engine.core.sequence import Sequence
from modeldeploy.runtime.engine.detokenizer import Detokenizer
from modeldeploy.runtime.engine.lora.pool import AdapterPool
from modeldeploy.runtime.engine.output import EngineStats, RequestMetrics, RequestOutput
from modeldeploy.runtime.engine.parallel.tensor_parallel import TensorParallel
from modeldeploy.runtime.engine.request_check import check_adapter, check_request
from modeldeploy.runtime.engine.sample.sampler import Sampler
from modeldeploy.runtime.engine.sampling_params import SamplingParams
from modeldeploy.runtime.engine.structured_output.grammar import (
    LIBRARY,
    GrammarCompiler,
    GrammarMasks,
    apply_bitmask,
)
from modeldeploy.runtime.engine.worker.model_runner import ModelRunner
from modeldeploy.runtime.loader import load


class LLMEngine:
    def __init__(self, config: EngineConfig, progress: Callable[[str, float], None] = lambda p, f: None):
        config = dataclasses.replace(config)
        config.validate()
        self.tp: TensorParallel | None = None
        try:
            self._build(config, progress)
        except BaseException:
            self.close()
            raise
        if self.tp is not None:
            weakref.finalize(self, self.tp.stop)  # an engine dropped without close() stops its ranks

    def _start_ranks(self, config: EngineConfig, device: torch.device) -> None:
        """Before rank 0 reads its weights: start the other ranks, which read their shards meanwhile."""
        if config.tensor_parallel_size > 1:
            self.tp = TensorParallel(config, device)

    def _build(self, config: EngineConfig, progress: Callable[[str, float], None]) -> None:
        loaded = load(config, progress, before_weights=lambda args, device: self._start_ranks(config, device))
        worker_free = None
        self.weight_bytes = [sum(quant.nbytes(t) for t in loaded.weights.values())]  # quantized too
        if self.tp is not None:
            progress("waiting for ranks", 0.9)
            reports = self.tp.wait_ready(config.tp_timeout_s + 600)
            frees = [r.free_bytes for r in reports if r.free_bytes is not None]
            worker_free = min(frees) if frees else None
            self.weight_bytes += [r.weight_bytes for r in reports]
        self.adapters = (
            AdapterPool(config.adapters, loaded.args, loaded.dtype, loaded.device, config.max_loras, progress)
            if config.adapters
            else None
        )
        progress("allocating kv cache", 0.92)
        lora_bytes = self.adapters.device_bytes if self.adapters else 0
        if loaded.device.type == "cpu" and config.num_kv_blocks is None and config.kv_cache_cpu_bytes is None:
            config.kv_cache_cpu_bytes = cpu_kv_budget(available_memory_bytes(), config.tensor_parallel_size)
        num_blocks = config.num_kv_blocks or auto_blocks(config, loaded, lora_bytes, worker_free)
        loaded.max_model_len = fit_max_model_len(config, loaded, num_blocks)
        # The effective configuration: every 'auto' resolved, so /v1/bundle shows what runs.
        config.max_model_len, config.num_kv_blocks = loaded.max_model_len, num_blocks
        config.dtype, config.device = str(loaded.dtype).removeprefix("torch."), loaded.device.type
        config.resolve_schedule(loaded.device.type)
        config.model_digest = config.model_digest or loaded.model_digest
        config.tokenizer_digest = config.tokenizer_digest or loaded.tokenizer_digest
        if self.adapters:
            config.adapters = [dict(p) for p in self.adapters.pins]  # digests filled in
            self.adapters.allocate()
        config.validate()
        self.config = config
        self.max_model_len = loaded.max_model_len  # config.max_model_len, resolved
        self.loaded_info = loaded
        self.tokenizer = loaded.tokenizer
        self.eos_token_ids = set(loaded.eos_token_ids)
        if self.tp is not None:
            self.tp.alloc(num_blocks, config.block_size, loaded.max_model_len)
        reduce = self.tp.collective.all_reduce if self.tp is not None else None
        self.runner = ModelRunner(
            loaded, num_blocks, config.block_size, loaded.max_model_len, self.adapters, self.tp, reduce
        )
        rope = self.runner.model.rope
        self.block_manager = BlockManager(
            num_blocks,
            config.block_size,
            config.bundle_id,
            config.enable_prefix_caching,
            rope.prefix_key if rope.length_dependent else None,  # blocks rotated per prompt length
        )
        self.scheduler = Scheduler(
            self.block_manager,
            config.max_num_seqs,
            config.max_num_batched_tokens,
            config.enable_chunked_prefill,
            self.adapters.num_slots if self.adapters else None,
            target_step_s=config.target_itl_ms / 1e3 if config.target_itl_ms else None,
            prefill_order=config.prefill_order,
            target_ttft_s=config.target_ttft_ms / 1e3 if config.target_ttft_ms else None,
        )
        self.sampler = Sampler(self.eos_token_ids, apply_bitmask)
        vocab = loaded.args.vocab_size
        self.grammars = GrammarCompiler(
            self.tokenizer, vocab, sorted(self.eos_token_ids), config.grammar_cache_size
        )
        self.masks = GrammarMasks(vocab)
        self.seqs: dict[str, Sequence] = {}  # by sequence id (a request's choice i > 0 is 'rid#i')
        self.groups: dict[str, list[Sequence]] = {}  # by request id: its choices
        self.detoks: dict[str, Detokenizer] = {}
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.steps_total = 0
        progress("warming up", 0.95)
        self._warmup()
        if config.cuda_graphs:  # config.validate() above refused it on the resolved device cpu
            progress("capturing cuda graphs", 0.97)
            self.runner.capture_graphs(config.max_num_seqs)
        progress("ready", 1.0)

    def _warmup(self) -> None:
        """One real forward so the first request pays no lazy initialisation."""
        self.add_request("__warmup__", [0], SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
        while self.scheduler.has_work():
            self.step()
        self.prompt_tokens_total = self.generation_tokens_total = self.steps_total = 0
        self.block_manager.hits = 0
        self.scheduler.cost = PrefillCost()  # the warmup's first forward pays lazy setup: not a step's cost

    def encode(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            return list(self.tokenizer(prompt)["input_ids"])
        return list(prompt)

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        arrival_time: float | None = None,
        adapter: str | None = None,
    ) -> Sequence:
        """Validate and queue; ValueError names the problem, and nothing is queued on error.
        `adapter`: a configured LoRA adapter's name (None = the base model)."""
        params.validate()
        adapter_id = self.adapter_id(adapter)
        if request_id in self.groups:
            raise ValueError(f"request_id: {request_id!r} is already running")
        ids = self.encode(prompt)
        vocab = self.loaded_info.args.vocab_size
        if any((not isinstance(t, int)) or t < 0 or t >= vocab for t in ids):
            raise ValueError(f"prompt: token ids must be integers in [0, {vocab})")
        check_request(len(ids), params.max_tokens, self.max_model_len)
        if any(t >= vocab for t in params.logit_bias):
            raise ValueError(f"logit_bias: token ids must be in [0, {vocab})")
        seq = Sequence(request_id, ids, params, adapter_id=adapter_id)
        if params.structured is not None:
            seq.grammar = self.grammars.matcher(params.structured)  # compiled already when prepared off-loop
        if arrival_time is not None:
            seq.arrival_time = arrival_time
        self.seqs[request_id] = seq
        self.groups[request_id] = [seq]
        self.detoks[request_id] = Detokenizer(self.tokenizer, list(params.stop))
        self.scheduler.add(seq)
        self.prompt_tokens_total += len(ids)
        return seq

    def adapter_id(self, name: str | None) -> int:
        """-1 for the base model (None or ''), else the adapter's id; ValueError if unknown."""
        check_adapter(name, list(self.adapters.ids) if self.adapters is not None else [])
        if not name or self.adapters is None:
            return -1
        return self.adapters.id_of(name)

    def abort(self, request_id: str) -> list[RequestOutput]:
        """Abort every unfinished choice of the request; their final outputs (none if all had finished)."""
        outs = []
        for seq in self.groups.get(request_id, []):
            if not seq.finished:
                self.scheduler.finish(seq, "abort")
                outs.append(self._output(seq, final=True))
        return outs

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def step(self) -> list[RequestOutput]:
        start = time.perf_counter()
        batch = self.scheduler.schedule()
        if batch.empty:
            return []
        outputs = self._run(batch)
        # the whole step, as a decoding stream sees it: what the time-bounded prefill chunk learns from
        self.scheduler.observe(batch, time.perf_counter() - start)
        return outputs

    def _run(self, batch: ScheduledBatch) -> list[RequestOutput]:
        logits, sample_seqs = self.runner.run(batch)
        for seq, n in zip(batch.seqs, batch.num_tokens, strict=True):
            seq.num_computed_tokens += n
            seq.prefill_chunks += seq.first_token_time is None
            self.block_manager.commit(seq)
        sample_seqs, logits = self._fork(sample_seqs, logits)
        bitmask, masked = self.masks.fill(sample_seqs)
        sampled = self.sampler.sample(logits, sample_seqs, bitmask, masked)
        tokens = sampled.tokens
        refused = {id(s) for s in self.masks.accept(sample_seqs, tokens, masked)}
        now = time.monotonic()
        self.steps_total += 1
        outputs = []
        for seq, tok, lp in zip(sample_seqs, tokens, sampled.logprobs, strict=True):
            seq.token_ids.append(tok)
            if lp is not None:
                seq.logprobs.append(lp)
            seq.first_token_time = seq.first_token_time or now
            seq.last_token_time = now
            self.generation_tokens_total += 1
            reason = "abort" if id(seq) in refused else self._finish_reason(seq, tok)
            if reason is not None:
                self.scheduler.finish(seq, reason)
            outputs.append(self._output(seq, final=reason is not None))
        return outputs

    def _fork(self, seqs: list[Sequence], logits: torch.Tensor) -> tuple[list[Sequence], torch.Tensor]:
        """n > 1: when a prompt's prefill completes, its other n-1 choices start here, sharing its
        KV blocks by reference (the partial last block copied) and sampling from the same logits row."""
        if all(s.params.n == 1 or s.output_token_ids or len(self.groups[s.group_id]) > 1 for s in seqs):
            return seqs, logits
        rows = list(range(len(seqs)))
        for r, parent in enumerate(list(seqs)):
            if parent.params.n == 1 or parent.output_token_ids or len(self.groups[parent.group_id]) > 1:
                continue
            for i in range(1, parent.params.n):
                child = Sequence(
                    f"{parent.request_id}#{i}",
                    parent.prompt_token_ids,
                    parent.params,
                    adapter_id=parent.adapter_id,
                )
                child.group_id, child.index, child.arrival_time = parent.group_id, i, parent.arrival_time
                child.first_scheduled_time = parent.first_scheduled_time
                if parent.grammar is not None:
                    child.grammar = parent.grammar.fork()
                self.seqs[child.request_id] = child
                self.groups[parent.group_id].append(child)
                self.detoks[child.request_id] = Detokenizer(self.tokenizer, list(parent.params.stop))
                partial = parent.num_computed_tokens % self.block_manager.block_size != 0
                if partial and self.block_manager.num_free == 0:
                    self.scheduler.add(child)  # no block to copy into: it waits and reuses the prefix cache
                    continue
                copies = self.block_manager.fork(parent, child)
                if copies:
                    self.runner.copy_blocks(copies)
                self.scheduler.adopt(child)
                seqs.append(child)
                rows.append(r)
        return seqs, logits[torch.tensor(rows, device=logits.device)]

    def _finish_reason(self, seq: Sequence, tok: int) -> str | None:
        p = seq.params
        detok = self.detoks[seq.request_id]
        detok.add(seq.output_token_ids)
        if seq.grammar is not None and seq.grammar.is_terminated():
            return "stop"  # the grammar is complete (its stop token was accepted)
        if detok.stopped or tok in p.stop_token_ids or (not p.ignore_eos and tok in self.eos_token_ids):
            return "stop"
        if len(seq.output_token_ids) >= p.max_tokens or seq.num_tokens >= self.max_model_len:
            return "length"
        return None

    def _output(self, seq: Sequence, final: bool) -> RequestOutput:
        detok = self.detoks[seq.request_id]
        out_ids = seq.output_token_ids
        new = out_ids[seq.num_emitted_tokens :]
        new_lps = seq.logprobs[seq.num_emitted_tokens :]
        seq.num_emitted_tokens = len(out_ids)
        if final:
            self.seqs.pop(seq.request_id, None)
            self.detoks.pop(seq.request_id, None)
            self.sampler.forget(seq.request_id)
            group = self.groups.get(seq.group_id, [])
            if all(s.finished for s in group):
                self.groups.pop(seq.group_id, None)
        return RequestOutput(
            request_id=seq.group_id,
            prompt_token_ids=seq.prompt_token_ids,
            token_ids=list(out_ids),
            new_token_ids=new,
            text=detok.text,
            delta_text=detok.delta(final),
            finished=final,
            finish_reason=seq.finish_reason if final else None,
            metrics=RequestMetrics(
                seq.arrival_time,
                seq.first_scheduled_time,
                seq.first_token_time,
                seq.last_token_time,
                seq.finished_time,
                seq.prefill_chunks,
            ),
            num_preemptions=seq.num_preemptions,
            index=seq.index,
            logprobs=list(seq.logprobs),
            new_logprobs=new_lps,
            prompt_logprobs=self._prompt_logprobs(seq),
        )

    @staticmethod
    def _prompt_logprobs(seq: Sequence) -> list | None:
        """The prompt's scores when asked and complete (an abort mid-prefill has none to give)."""
        if seq.params.prompt_logprobs is None or seq.index != 0:
            return None
        if len(seq.prompt_logprobs) != max(seq.num_prompt_tokens - 1, 0):
            return None
        return seq.prompt_logprobs

    def close(self) -> None:
        """Stop the other tensor-parallel ranks (nothing to do without them)."""
        if self.tp is not None:
            self.tp.stop()

    def parallel_info(self) -> dict:
        """The parallel layout, for /v1/bundle: ranks, backend, heads and kv heads per rank."""
        li = self.loaded_info
        ra = li.rank_args
        return {
            "tensor_parallel_size": li.shard.size,
            "backend": self.tp.collective.backend if self.tp else None,
            "heads_per_rank": ra.num_heads,
            "kv_heads_per_rank": ra.num_kv_heads,
            "kv_head_replicas": li.shard.kv_head_replicas(li.args),
            "intermediate_per_rank": ra.intermediate_size,
            "worker_pids": self.tp.pids if self.tp else [],
            "weight_bytes_per_rank": list(self.weight_bytes),
        }

    def stats(self) -> EngineStats:
        bm = self.block_manager
        return EngineStats(
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            kv_usage=bm.usage(),
            num_free_blocks=bm.num_free,
            num_total_blocks=bm.num_total,
            preemptions_total=self.scheduler.preemptions_total,
            prompt_tokens_total=self.prompt_tokens_total,
            generation_tokens_total=self.generation_tokens_total,
            steps_total=self.steps_total,
            prefix_cache_hit_tokens=bm.hits,
            lora_resident=tuple(self.adapters.resident_names()) if self.adapters else (),
            lora_loads_total=self.adapters.loads_total if self.adapters else 0,
            tensor_parallel_size=self.config.tensor_parallel_size,
            tp_allreduce_bytes_total=self.tp.collective.bytes_total if self.tp else 0,
        )

    def info(self) -> dict:
        li = self.loaded_info
        return {
            "architecture": li.args.architecture,
            "model_dir": self.config.model,
            "model_digest": li.model_digest,
            "tokenizer_digest": li.tokenizer_digest,
            "dtype": self.config.dtype,
            "device": self.config.device,
            # a GGUF model's formats kept quantized / de-quantized (loader.py); None: float weights
            "quantization": li.quantization,
            "num_kv_blocks": self.config.num_kv_blocks,
            "block_size": self.config.block_size,
            "max_model_len": self.config.max_model_len,
            "grammar_library": dict(LIBRARY),
            "kernels": dispatch.describe(self.config.device)
            | ({"decode_steps": self.runner.decode_steps} if self.config.device == "cpu" else {}),
            "parallel": self.parallel_info(),
            "adapters": self.adapters.info() if self.adapters else [],
            "lora": (
                {
                    "max_loras": self.adapters.num_slots,
                    "max_rank": self.adapters.rank,
                    "sites": list(self.adapters.sites),
                    "slot_bytes": self.adapters.slot_bytes,
                    "device_bytes": self.adapters.device_bytes,
                    "host_bytes": self.adapters.host_bytes,
                    "resident": self.adapters.resident_names(),
                }
                if self.adapters
                else None
            ),
        }
