"""A first-time user of a Python client generated from keel's /openapi.json (by
openapi-python-client): create a project, read the billing view, claim the starter credit,
save a card and top up, enqueue a training job, and claim it as a worker; then schedule the
job nightly and run the schedule now. Only the generated client is used."""

import os
import sys

from keel_client import AuthenticatedClient
from keel_client.api.billing import get_billing, save_payment_method, starter_credit, topup
from keel_client.api.projects import create_project
from keel_client.api.training import create_job, create_schedule, get_job, get_schedule, run_schedule
from keel_client.api.training_internal import claim_jobs
from keel_client.models import (
    BillingView,
    CatchUpName,
    ClaimedJobs,
    CreditView,
    InternalClaimJobsRequest,
    JobAction,
    JobView,
    CardView,
    OrgBody,
    PaymentMethodBody,
    TopupBody,
    TopupView,
    ProjectCreateBody,
    ProjectCreated,
    ScheduleCreateBody,
    ScheduleView,
    TrainingJob,
    TrainingJobAction,
)


def expect(value, kind, what):
    if not isinstance(value, kind):
        sys.exit(f"{what}: expected {kind.__name__}, got {value!r}")
    return value


url, org_id = os.environ["KEEL_URL"], os.environ["KEEL_ORG_ID"]
user = AuthenticatedClient(base_url=url, token=os.environ["KEEL_API_KEY"], raise_on_unexpected_status=True)
worker = AuthenticatedClient(base_url=url, token=os.environ["KEEL_INTERNAL_KEY"], raise_on_unexpected_status=True)

project = expect(
    create_project.sync(client=user, body=ProjectCreateBody(name="Client walkthrough")),
    ProjectCreated,
    "create project",
)
billing = expect(get_billing.sync(client=user, org_id=org_id), BillingView, "billing")
print(f"project {project.slug}; balance {billing.balance_cents} cents")
if not billing.starter_credit_granted:
    expect(starter_credit.sync(client=user, body=OrgBody(org_id=org_id)), CreditView, "starter credit")
# Whatever the fuzzing before spent, the job's run fee is covered.
card = PaymentMethodBody(org_id=org_id, payment_method_id="pm_card_visa")
expect(save_payment_method.sync(client=user, body=card), CardView, "save a card")
topped = expect(topup.sync(client=user, body=TopupBody(org_id=org_id, amount_cents=500)), TopupView, "top up")
print(f"topped up: balance {topped.balance_cents} cents")

queued = expect(
    create_job.sync(
        client=user,
        body=TrainingJob(
            action=TrainingJobAction.TRAINING,
            project_id=project.id,
            model="meta-llama/Llama-3.1-8B-Instruct",
            environment_slug="contract/client-walkthrough/env",
        ),
    ),
    JobView,
    "enqueue",
)
claimed = expect(
    claim_jobs.sync(
        client=worker,
        body=InternalClaimJobsRequest(worker_id="walkthrough-worker", action=JobAction.TRAINING, limit=10),
    ),
    ClaimedJobs,
    "claim",
)
if queued.job_id not in [job.job_id for job in claimed.jobs]:
    sys.exit(f"the job {queued.job_id} was not claimed: {claimed!r}")
after = expect(get_job.sync(client=user, job_id=queued.job_id), JobView, "read job")
if after.status != "running":
    sys.exit(f"a claimed job is running, this one is {after.status}")
print(f"job {queued.job_id} enqueued and claimed ({after.status})")
expect(get_billing.sync(client=user, org_id=org_id), BillingView, "billing after")

nightly = expect(
    create_schedule.sync(
        client=user,
        body=ScheduleCreateBody(
            name="nightly training",
            cron="30 2 * * *",
            timezone="Europe/Berlin",
            catch_up=CatchUpName.LATEST,
            job=TrainingJob(
                action=TrainingJobAction.TRAINING,
                project_id=project.id,
                model="meta-llama/Llama-3.1-8B-Instruct",
                environment_slug="contract/client-walkthrough/env",
            ),
        ),
    ),
    ScheduleView,
    "create a schedule",
)
if len(nightly.next_runs) != 5 or nightly.next_run_at != nightly.next_runs[0]:
    sys.exit(f"a new schedule shows its next five ticks: {nightly!r}")
ran = expect(run_schedule.sync(schedule_id=nightly.schedule_id, client=user), JobView, "run a schedule now")
if ran.schedule_id != nightly.schedule_id or ran.schedule_tick is not None:
    sys.exit(f"a run now's job carries the schedule and no tick: {ran!r}")
read = expect(get_schedule.sync(schedule_id=nightly.schedule_id, client=user), ScheduleView, "read a schedule")
if [job.job_id for job in read.recent_jobs] != [ran.job_id]:
    sys.exit(f"the schedule lists its job: {read!r}")
print(f"schedule {nightly.schedule_id}: next tick {nightly.next_run_at}, run now as job {ran.job_id}")
