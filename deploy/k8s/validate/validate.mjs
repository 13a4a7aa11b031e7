// Validates every object of kustomize builds against the Kubernetes OpenAPI schemas
// (kubernetes-models; the prometheus-operator and KEDA models for their CRDs), plus
// what rlfleet's manifests promise: every container has a readiness probe, every
// object carries the fleet's part-of label, GPU workloads of an overlay that asks for
// GPUs request them. Reads each build (YAML, as `kubectl kustomize` prints it) from
// the files named on the command line; prints one line per build; exits 1 on any
// problem. A self-test first proves the validator rejects a broken object.
// With RUN_FILES_DIR set, each build's run file (ConfigMap rlfleet-run, run.yaml) is
// written there as NAME.run.yaml, for the binaries to check (tools/check_k8s.sh).
//   node validate.mjs NAME=FILE [NAME=FILE ...]
import { readFileSync, writeFileSync } from "node:fs";
import { parseAllDocuments } from "yaml";

// apiVersion -> the module that holds its kinds.
function moduleFor(apiVersion) {
  if (apiVersion === "monitoring.coreos.com/v1") return "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1";
  if (apiVersion === "keda.sh/v1alpha1") return "@kubernetes-models/keda/keda.sh/v1alpha1";
  return `kubernetes-models/${apiVersion}`;
}

async function validate(object) {
  const { apiVersion, kind } = object;
  if (!apiVersion || !kind) throw new Error("no apiVersion or kind");
  let mod;
  try {
    mod = await import(moduleFor(apiVersion));
  } catch (e) {
    throw new Error(`no schema for apiVersion ${apiVersion}`);
  }
  const Model = mod[kind];
  if (typeof Model !== "function") throw new Error(`no schema for ${apiVersion} ${kind}`);
  new Model(object).validate();  // throws with the failing paths
}

const WORKLOADS = new Set(["Deployment", "StatefulSet"]);

// Every container: not root (a non-zero uid and gid), no privilege escalation, every
// capability dropped, a read-only root filesystem, the runtime's default seccomp profile
// (the container's setting or the pod's).
function securityProblems(c, spec) {
  const problems = [];
  const sc = c.securityContext ?? {};
  const pod = spec.securityContext ?? {};
  const pick = (key) => sc[key] ?? pod[key];
  if (pick("runAsNonRoot") !== true) problems.push(`container ${c.name}: runAsNonRoot is not true`);
  if (!(pick("runAsUser") > 0)) problems.push(`container ${c.name}: runAsUser is not a non-zero uid`);
  if (!(pick("runAsGroup") > 0)) problems.push(`container ${c.name}: runAsGroup is not a non-zero gid`);
  if (sc.readOnlyRootFilesystem !== true) problems.push(`container ${c.name}: root filesystem not read-only`);
  if (sc.allowPrivilegeEscalation !== false) problems.push(`container ${c.name}: allowPrivilegeEscalation is not false`);
  if (sc.privileged) problems.push(`container ${c.name}: privileged`);
  const drop = sc.capabilities?.drop ?? [];
  if (!drop.includes("ALL")) problems.push(`container ${c.name}: capabilities do not drop ALL`);
  if ((sc.capabilities?.add ?? []).length) problems.push(`container ${c.name}: adds capabilities`);
  if (pick("seccompProfile")?.type !== "RuntimeDefault") {
    problems.push(`container ${c.name}: seccompProfile is not RuntimeDefault`);
  }
  return problems;
}

function fleetChecks(object, wantGpus) {
  const problems = [];
  const labels = object.metadata?.labels ?? {};
  if (labels["app.kubernetes.io/part-of"] !== "rlfleet") problems.push("lacks label app.kubernetes.io/part-of=rlfleet");
  if (WORKLOADS.has(object.kind)) {
    const spec = object.spec.template.spec;
    for (const c of [...spec.containers, ...(spec.initContainers ?? [])]) {
      if (!c.readinessProbe && !(spec.initContainers ?? []).includes(c)) {
        problems.push(`container ${c.name} has no readinessProbe`);
      }
      problems.push(...securityProblems(c, spec));
    }
    if (spec.automountServiceAccountToken !== false) problems.push("mounts a service-account token");
    const pool = object.spec.template.metadata?.labels?.["rlfleet.io/pool"] ?? "";
    if (wantGpus && pool.endsWith("-gpu")) {
      const gpus = spec.containers[0].resources?.limits?.["nvidia.com/gpu"];
      if (!(gpus >= 1)) problems.push(`a ${pool} workload without nvidia.com/gpu limits`);
      if (spec.nodeSelector?.["rlfleet.io/pool"] !== pool) problems.push(`not placed on its pool ${pool}`);
    }
  }
  return problems;
}

async function selfTest() {
  const broken = { apiVersion: "apps/v1", kind: "Deployment", metadata: { name: "x" },
                   spec: { replicas: "two", selector: {}, template: {} } };
  try {
    await validate(broken);
  } catch (e) {
    return;
  }
  throw new Error("self-test: a Deployment with replicas \"two\" validated");
}

function securitySelfTest() {
  const root = { name: "c", securityContext: { runAsUser: 0 } };
  if (securityProblems(root, {}).length < 6) throw new Error("self-test: a root container passed the security checks");
}

let failed = false;
await selfTest();
securitySelfTest();
for (const arg of process.argv.slice(2)) {
  const [name, file] = arg.split("=");
  const docs = parseAllDocuments(readFileSync(file, "utf8"));
  let count = 0;
  const kinds = new Set();
  for (const doc of docs) {
    if (doc.errors.length) {
      console.log(`${name}: YAML error: ${doc.errors[0].message}`);
      failed = true;
      continue;
    }
    const object = doc.toJS();
    if (object == null) continue;
    const id = `${object.kind}/${object.metadata?.name}`;
    try {
      await validate(object);
    } catch (e) {
      console.log(`${name}: ${id}: ${e.message}`);
      failed = true;
    }
    for (const p of fleetChecks(object, name.includes("pools"))) {
      console.log(`${name}: ${id}: ${p}`);
      failed = true;
    }
    if (object.kind === "ConfigMap" && object.metadata?.name === "rlfleet-run" && process.env.RUN_FILES_DIR) {
      writeFileSync(`${process.env.RUN_FILES_DIR}/${name}.run.yaml`, object.data["run.yaml"]);
    }
    kinds.add(object.kind);
    count++;
  }
  if (count === 0) {
    console.log(`${name}: no objects`);
    failed = true;
  }
  console.log(`${name}: ${count} objects (${[...kinds].sort().join(", ")})`);
}
process.exit(failed ? 1 : 0);
