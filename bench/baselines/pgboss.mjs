// pg-boss drains N no-op jobs: `node pgboss.mjs DATABASE_URL JOBS LOOPS BATCH`. The jobs are
// inserted in batches of 1,000 (boss.insert), then LOOPS work loops of one process fetch BATCH
// at a time (polling every 0.5 s, pg-boss's shortest); prints one JSON line:
// {"enqueue_per_second", "jobs_per_second"}.
import PgBoss from "pg-boss";

const [url, jobsArg, loopsArg, batchArg] = process.argv.slice(2);
const jobs = Number(jobsArg);
const loops = Number(loopsArg);
const batchSize = Number(batchArg);

const boss = new PgBoss({ connectionString: url, max: loops + 2, supervise: false, schedule: false });
boss.on("error", (error) => console.error(error));
await boss.start();
await boss.createQueue("noop");
const added = performance.now();
for (let i = 0; i < jobs; i += 1000) {
  const chunk = [];
  for (let j = i; j < Math.min(i + 1000, jobs); j++) chunk.push({ name: "noop", data: { n: j } });
  await boss.insert(chunk);
}
const enqueueSeconds = (performance.now() - added) / 1000;

let done = 0;
let finish;
const finished = new Promise((resolve) => (finish = resolve));
const started = performance.now();
console.error("drain started");
for (let i = 0; i < loops; i++) {
  await boss.work("noop", { batchSize, pollingIntervalSeconds: 0.5 }, async (batch) => {
    done += batch.length;
    if (done >= jobs) finish();
  });
}
await finished;
console.error("drain ended");
const seconds = (performance.now() - started) / 1000;
console.log(JSON.stringify({ enqueue_per_second: jobs / enqueueSeconds, jobs_per_second: jobs / seconds, done }));
// Its stop waits on the work loops' polls; the figure is out, the scratch database goes next.
process.exit(0);
