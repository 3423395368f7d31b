//! An example of every request body, shown in `/docs` and by generated clients. The ids are
//! placeholders of the right shape; a test sends each one to a fresh service.

use serde_json::{json, Value};

const ORG: &str = "0b6f5f0e-4c1a-4a44-9d5c-2f1c3e0a7b11";
const PROJECT: &str = "5d0c8e2a-9f61-4b7e-8f3a-1c2d3e4f5a6b";
const SLUG: &str = "acme/support/chat-env";
const RUN: &str = "run-2026-11-24-001";
const WORKER: &str = "worker-a100-01";
const JOB: &str = "0193c2f0-7a1e-7c55-9b1d-3e4f5a6b7c8d";

/// `(method, path, example)` of every operation with a JSON request body.
pub fn request_examples() -> Vec<(&'static str, &'static str, Value)> {
    vec![
        (
            "post",
            "/api/datasets",
            json!({"projectId": PROJECT, "name": "refund answers", "description": "good refund replies",
            "filter": {"q": "refund", "status": "ok", "minScore": "quality:0.8"},
            "split": {"validation": 0.1, "seed": 7}, "dedupe": "prompt"}),
        ),
        (
            "patch",
            "/api/datasets/{dataset_id}",
            json!({"name": "refund answers (reviewed)", "description": null}),
        ),
        (
            "post",
            "/api/datasets/{dataset_id}/versions",
            json!({"filter": {"tag": "reviewed"}, "traceIds": {"remove": [JOB]}}),
        ),
        (
            "post",
            "/api/agent-logs",
            json!({"content": "step 120: loss 0.42"}),
        ),
        (
            "post",
            "/api/api-keys",
            json!({"name": "eval harness", "scopes": ["inference"], "models": ["gpt-4o-mini"],
            "limits": {"requestsPerMinute": 60, "tokensPerDay": 200000, "concurrentStreams": 4},
            "expiresAt": "2031-01-31T00:00:00Z"}),
        ),
        (
            "patch",
            "/api/api-keys/{api_key_id}",
            json!({"limits": {"requestsPerMinute": 120, "tokensPerDay": null}}),
        ),
        (
            "put",
            "/api/billing/auto-topup",
            json!({"orgId": ORG, "enabled": true, "thresholdCents": 1000, "amountCents": 5000}),
        ),
        ("post", "/api/billing/debit", json!({"orgId": ORG, "runId": RUN})),
        (
            "post",
            "/api/billing/payment-method",
            json!({"orgId": ORG, "paymentMethodId": "pm_card_visa"}),
        ),
        (
            "post",
            "/api/billing/promo-code",
            json!({"orgId": ORG, "code": "WELCOME10"}),
        ),
        (
            "post",
            "/api/billing/serving-usage",
            json!({"requestId": "gen-7f3a", "adapterId": "acme/support-bot", "promptTokens": 812, "completionTokens": 164}),
        ),
        ("post", "/api/billing/setup-intent", json!({"orgId": ORG})),
        ("post", "/api/billing/starter-credit", json!({"orgId": ORG})),
        (
            "post",
            "/api/internal/billing/grants",
            json!({"orgId": ORG, "amountCents": 2500, "reason": "goodwill: the outage of 2026-11-20", "expiresAt": "2099-01-01T00:00:00Z", "priority": 10}),
        ),
        (
            "post",
            "/api/billing/topup",
            json!({"orgId": ORG, "amountCents": 2500}),
        ),
        (
            "post",
            "/api/billing/training-cost",
            json!({"runId": RUN, "costCents": 1234, "provider": "modal"}),
        ),
        (
            "post",
            "/api/billing/training-usage",
            json!({"runId": RUN, "estimateCents": 800}),
        ),
        (
            "post",
            "/api/billing/training-usage/internal",
            json!({"orgId": ORG, "runId": RUN, "amountCents": 790}),
        ),
        (
            "post",
            "/api/billing/training-usage/precheck",
            json!({"orgId": ORG, "estimateCents": 800}),
        ),
        (
            "post",
            "/api/billing/webhook",
            json!({"id": "evt_1", "type": "payment_intent.succeeded", "data": {"object": {"id": "pi_1", "metadata": {"orgId": ORG}}}}),
        ),
        (
            "post",
            "/api/evals/runs",
            json!({
                "project_id": PROJECT, "suite_name": "support-regression", "environment_reference": SLUG,
                "model": "gpt-4o-mini", "status": "completed", "started_at": "2026-11-24T10:00:00Z",
                "metadata": {"commit": "a1b2c3d"},
                "cases": [
                    {"case_id": "refund-1", "input": "Can I get a refund?", "expected": "Yes, within 30 days.", "actual": "Yes, within 30 days.", "score": 1.0, "success": true, "latency_ms": 420, "total_tokens": 96},
                    {"case_id": "refund-2", "input": "Refund after 40 days?", "expected": "No.", "actual": "Yes.", "score": 0.0, "success": false, "reason": "wrong policy"}
                ]
            }),
        ),
        (
            "post",
            "/api/flash/environments/internal",
            json!({"orgId": ORG, "projectId": PROJECT, "slug": SLUG, "name": "chat-env", "hubPath": "envs/chat-env", "metadata": {"python": "3.11"}}),
        ),
        (
            "delete",
            "/api/flash/environments/internal",
            json!({"orgId": ORG, "projectId": PROJECT, "slug": SLUG}),
        ),
        (
            "post",
            "/api/flash/environments/use/internal",
            json!({"orgId": ORG, "projectId": PROJECT, "slug": SLUG, "runId": RUN}),
        ),
        (
            "post",
            "/api/flash/environments/validate/internal",
            json!({"orgId": ORG, "projectId": PROJECT, "slug": SLUG}),
        ),
        (
            "post",
            "/api/flash/events/internal",
            json!({"orgId": ORG, "event": "training_run_started", "userId": "user-1", "properties": {"model": "llama-3.1-8b"}}),
        ),
        (
            "post",
            "/api/flash/projects/validate/internal",
            json!({"orgId": ORG, "projectId": PROJECT}),
        ),
        (
            "post",
            "/api/flash/runs/checkpoints/internal",
            json!({"orgId": ORG, "projectId": PROJECT, "runId": RUN, "checkpointId": "ckpt-100", "seed": 7, "phase": "sft", "metrics": {"loss": 0.42}}),
        ),
        (
            "post",
            "/api/flash/runs/internal",
            json!({"orgId": ORG, "projectId": PROJECT, "runId": RUN, "status": "running", "model": "llama-3.1-8b", "gpuType": "A100", "costUsd": 1.25, "updatedAt": "2026-11-24T10:05:00Z"}),
        ),
        (
            "put",
            "/api/internal/adapters/{adapter_id}",
            json!({"orgId": ORG, "baseModel": "meta-llama/Llama-3.1-8B-Instruct", "live": true}),
        ),
        (
            "post",
            "/api/internal/orgs",
            json!({"name": "Acme", "ownerUserId": "user-1", "ownerEmail": "ada@acme.test"}),
        ),
        (
            "post",
            "/api/internal/orgs/{org_id}/api-keys",
            json!({"name": "control-plane"}),
        ),
        (
            "put",
            "/api/internal/orgs/{org_id}/members/{user_id}",
            json!({"role": "member", "email": "bob@acme.test"}),
        ),
        (
            "post",
            "/api/projects",
            json!({"name": "Support bot", "description": "Customer support assistant"}),
        ),
        (
            "post",
            "/api/runs",
            json!({"projectId": PROJECT, "name": "sft-1", "model": "llama-3.1-8b", "environmentSlug": SLUG, "config": {"lr": 0.0002}}),
        ),
        (
            "post",
            "/api/runs/internal/checkpoints",
            json!({"orgId": ORG, "projectId": PROJECT, "runId": RUN, "checkpoints": [{"step": 100, "subfolder": "checkpoint-100"}]}),
        ),
        (
            "patch",
            "/api/runs/{run_id}",
            json!({"status": "completed", "summary": {"final_loss": 0.31}, "metrics": {"loss": 0.31}}),
        ),
        (
            "post",
            "/api/runs/{run_id}/tracker",
            json!({"entity": "acme", "project": "support", "trackerRunId": "3kq9z1", "url": "https://tracker.example/acme/support/3kq9z1"}),
        ),
        (
            "post",
            "/api/sample",
            json!({"model": "acme/support-bot", "messages": [{"role": "user", "content": "Capital of France?"}], "max_tokens": 32, "temperature": 0.2}),
        ),
        (
            "post",
            "/api/serving/authorize",
            json!({"apiKey": "keel_sk_0123456789abcdefghijklmnopqrstuv", "adapterId": "acme/support-bot"}),
        ),
        ("post", "/api/serving/teardown", json!({"orgId": ORG})),
        (
            "post",
            "/api/traces/export",
            json!({"traceIds": ["0193c2f0-7a1e-7c55-9b1d-3e4f5a6b7c8d"], "format": "records"}),
        ),
        (
            "post",
            "/api/traces/{trace_id}/tags",
            json!({"add": ["good", "refund:v2"], "remove": ["to-review"]}),
        ),
        (
            "post",
            "/api/traces/tags",
            json!({"traceIds": ["0193c2f0-7a1e-7c55-9b1d-3e4f5a6b7c8d"], "add": ["batch-1"]}),
        ),
        (
            "put",
            "/api/traces/{trace_id}/scores/{name}",
            json!({"value": 0.9, "comment": "accurate and polite"}),
        ),
        (
            "patch",
            "/api/projects/{project_id}",
            json!({"traceRetentionDays": 30}),
        ),
        (
            "post",
            "/api/training/internal/agent-logs",
            json!({"org_id": ORG, "job_id": JOB, "content": "claimed by worker-a100-01"}),
        ),
        (
            "post",
            "/api/training/internal/agent-usage",
            json!({"account_label": "codex-1", "plan_type": "pro", "primary_used_percent": 42.5, "primary_window_minutes": 300, "primary_resets_at": 1795600000}),
        ),
        (
            "post",
            "/api/training/internal/jobs/blocked",
            json!({"job_id": JOB, "worker_id": WORKER, "reason": "environment not found"}),
        ),
        (
            "post",
            "/api/training/internal/jobs/claim",
            json!({"worker_id": WORKER, "action": "training", "limit": 1}),
        ),
        (
            "post",
            "/api/training/internal/jobs/failed",
            json!({"job_id": JOB, "worker_id": WORKER, "retryable": true, "error": "CUDA out of memory"}),
        ),
        (
            "post",
            "/api/training/internal/jobs/heartbeat",
            json!({"job_id": JOB, "worker_id": WORKER}),
        ),
        (
            "post",
            "/api/training/internal/jobs/heartbeats",
            json!({"worker_id": WORKER, "job_ids": [JOB]}),
        ),
        (
            "post",
            "/api/training/internal/jobs/reports",
            json!({"reports": [
                {"job_id": JOB, "worker_id": WORKER, "outcome": "succeeded", "result": {"adapter": "acme/support-bot"}},
                {"job_id": "0193c2f0-7a1e-7c55-9b1d-3e4f5a6b7c8e", "worker_id": WORKER, "outcome": "failed", "error": "CUDA out of memory", "retryable": true}
            ]}),
        ),
        (
            "post",
            "/api/training/internal/jobs/live-status",
            json!({"job_id": JOB, "worker_id": WORKER, "live_status": {"step": 120, "loss": 0.42}}),
        ),
        (
            "post",
            "/api/training/internal/jobs/requeue-interrupted",
            json!({"worker_id": WORKER}),
        ),
        (
            "post",
            "/api/training/internal/jobs/succeeded",
            json!({"job_id": JOB, "worker_id": WORKER, "result": {"adapter": "acme/support-bot"}}),
        ),
        (
            "post",
            "/api/training/internal/jobs/user-stopped",
            json!({"job_id": JOB, "worker_id": WORKER, "reason": "stopped by user"}),
        ),
        (
            "post",
            "/api/training/internal/optimizer-timelines/sync",
            json!({"org_id": ORG, "job_id": JOB, "timelines": [{"timeline_id": "tl-1", "events": [{"step": 1, "score": 0.61}]}]}),
        ),
        (
            "post",
            "/api/training/jobs",
            json!({"action": "training", "projectId": PROJECT, "model": "meta-llama/Llama-3.1-8B-Instruct", "environmentSlug": SLUG, "input": {"epochs": 2}, "priority": 3, "runAt": "2026-11-26T18:00:00Z", "uniqueKey": "nightly-sft"}),
        ),
        (
            "post",
            "/api/training/jobs/batch",
            json!({"jobs": [
                {"action": "tracer", "projectId": PROJECT, "priority": 1},
                {"action": "draft", "projectId": PROJECT, "prompt": "Summarise the ticket", "runAt": "2026-11-26T18:00:00Z"}
            ]}),
        ),
        (
            "post",
            "/api/training/jobs/{job_id}/stop",
            json!({"reason": "wrong dataset"}),
        ),
        ("post", "/api/training/jobs/{job_id}/retry", json!({"orgId": ORG})),
        (
            "post",
            "/api/training/schedules",
            json!({"name": "nightly eval", "cron": "30 2 * * *", "timezone": "Europe/Berlin", "catchUp": "latest",
            "job": {"action": "training", "projectId": PROJECT, "model": "meta-llama/Llama-3.1-8B-Instruct", "environmentSlug": SLUG, "uniqueKey": "nightly-eval"}}),
        ),
        (
            "patch",
            "/api/training/schedules/{schedule_id}",
            json!({"cron": "0 */6 * * *", "enabled": false}),
        ),
        (
            "put",
            "/api/internal/orgs/{org_id}/queue",
            json!({"weight": 3, "maxRunning": 10}),
        ),
        (
            "post",
            "/api/webhooks/endpoints",
            json!({"url": "https://hooks.example.com/keel", "events": ["job.failed", "billing.balance.low"], "description": "on-call"}),
        ),
        (
            "patch",
            "/api/webhooks/endpoints/{endpoint_id}",
            json!({"events": ["*"], "enabled": true}),
        ),
        (
            "post",
            "/api/training/secrets",
            json!({"secrets": {"HF_TOKEN": "hf_example", "OLD_TOKEN": ""}}),
        ),
        (
            "post",
            "/v1/chat/completions",
            json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hello"}]}),
        ),
    ]
}
