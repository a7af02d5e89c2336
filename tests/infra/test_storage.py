"""Shared storage for checkpoints, every stack file and the variants, under mocks.

Checked against: the FSx for Lustre user guide (LNET ports 988 and 1018-1023 from the file system's
own security group and its clients'; mount options ``relatime,flock``), the FSx API
(PERSISTENT_2 SSD: 1200, 2400 or multiples of 2400 GiB; 125/250/500/1000 MB/s/TiB), the FSx CSI
driver's install guide (``fsx-csi-controller-sa`` with AmazonFSxFullAccess; static volumes by
file system id, DNS name and mount name), Kubernetes 1.33's schemas (kubernetes-validate, strict),
the GPU taint, and torch.distributed.checkpoint's need for one directory every rank writes to.
"""

from __future__ import annotations

import kubernetes_validate
import pytest

from components import versions
from components.cluster import SYSTEM_NODE_LABEL
from components.stack import Export
from components.training_job import APP_UID
from tests.harness import (
    GPU_TAINT,
    HELM,
    POD_IDENTITY,
    PYTORCHJOB,
    Recording,
    Registration,
    container,
    installs_pin,
    job_of,
    parse,
    parse_flags,
    plain,
    raw_settings,
    release,
    settings_error,
    stack_config,
    tolerates,
    variant,
    worker,
)

FSX = "aws:fsx/lustreFileSystem:LustreFileSystem"
SG = "aws:ec2/securityGroup:SecurityGroup"
SG_INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
SUBNET = "aws:ec2/subnet:Subnet"
PV = "kubernetes:core/v1:PersistentVolume"
PVC = "kubernetes:core/v1:PersistentVolumeClaim"
CLUSTER_SG = "sg-eks-cluster"
"""The EKS cluster security group the mocks answer with; every node carries it."""
LUSTRE_PORTS = [(988, 988), (1018, 1023)]
"""FSx for Lustre user guide: the LNET ports, inbound from the file system's own group and the clients'."""
PERSISTENT_2_THROUGHPUTS = {125, 250, 500, 1000}


# --------------------------------------------------------------------------- helpers


def storage_config(stack: str) -> dict:
    return stack_config(stack)["fsdp-eks:storage"]


def file_system(rec: Recording) -> Registration:
    return rec.one(FSX)


def fsx_security_group(rec: Recording) -> Registration:
    (sg_id,) = file_system(rec).inputs["securityGroupIds"]
    (sg,) = [r for r in rec.of_type(SG) if f"{r.name}-id" == sg_id]
    return sg


def volume(rec: Recording) -> dict:
    return plain(rec.one(PV).inputs)


def shared_claims(rec: Recording) -> list:
    """The claims of the shared storage (not Prometheus' own claim, tests/infra/test_observability.py)."""
    return [r for r in rec.of_type(PVC) if not r.name.startswith("observability-")]


def claim(rec: Recording) -> dict:
    (r,) = shared_claims(rec)
    return plain(r.inputs)


def opens(rules: list[dict], lo: int, hi: int, *, self_: bool, group: str) -> bool:
    """Some TCP rule covers ``lo``-``hi`` for the group itself (``self_``) and for ``group``."""
    def covers(r):
        return r["protocol"] == "tcp" and int(r["fromPort"]) <= lo and hi <= int(r["toPort"])
    return (not self_ or any(covers(r) and r.get("self") for r in rules)) and any(
        covers(r) and group in r.get("securityGroups", []) for r in rules
    )


def shared_mount(rec: Recording) -> str:
    """The path where the workers mount the shared claim."""
    pod = worker(job_of(rec))["template"]["spec"]
    claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v}
    (path,) = [m["mountPath"] for m in container(job_of(rec))["volumeMounts"] if m["name"] in claims]
    return path


def raw(stack: str, **storage) -> dict:
    """The fsdp-eks keys of a stack file without namespace or secrets, ``storage`` changed."""
    config = raw_settings(stack)
    config["storage"] = {**config.get("storage", {}), **storage}
    return config


def problems(config: dict) -> dict[str, str]:
    return {p.key: str(p) for p in settings_error(config).problems}


# --------------------------------------------------------------------------- every stack: AWS


def test_stacks_run_multi_node_jobs_on_fsx(stack: str):
    """The committed stacks run 2-node jobs, so they must share storage."""
    assert stack_config(stack)["fsdp-eks:job"]["nodes"] > 1
    assert storage_config(stack)["fsx"] is True


def test_file_system_is_persistent_2_lustre_2_15_with_lz4(recording: Recording, stack: str):
    fs = file_system(recording)
    wanted = storage_config(stack)
    facts = {"deploymentType": "PERSISTENT_2", "fileSystemTypeVersion": "2.15", "dataCompressionType": "LZ4",
             "storageType": "SSD"}
    for key, value in facts.items():
        assert fs.inputs[key] == value, f"{fs.name}: {key} = {fs.inputs[key]!r}, want {value!r}"
    capacity, throughput = int(fs.inputs["storageCapacity"]), int(fs.inputs["perUnitStorageThroughput"])
    assert capacity == wanted["fsxStorageCapacityGiB"] and throughput == wanted["fsxThroughputPerTiB"]
    assert capacity == 1200 or capacity % 2400 == 0, f"{fs.name}: {capacity} GiB is not a PERSISTENT_2 size"
    assert throughput in PERSISTENT_2_THROUGHPUTS, f"{fs.name}: {throughput} MB/s/TiB"


def test_file_system_sits_in_the_gpu_az_private_subnet(recording: Recording, stack: str):
    """Lustre traffic between the GPU nodes and the file servers stays inside one AZ."""
    gpu_az = stack_config(stack)["fsdp-eks:gpuNodes"]["availabilityZone"]
    fs = file_system(recording)
    subnets = {f"{r.name}-id": r.inputs for r in recording.of_type(SUBNET)}
    subnet = subnets[fs.inputs["subnetIds"]]
    assert subnet["availabilityZone"] == gpu_az, f"{fs.name} in {subnet['availabilityZone']}, GPU nodes in {gpu_az}"
    assert not subnet.get("mapPublicIpOnLaunch"), f"{fs.name} in a public subnet"
    gpu_group = recording.one("aws:eks/nodeGroup:NodeGroup", "gpu-gpu")
    assert fs.inputs["subnetIds"] in gpu_group.inputs["subnetIds"], "not the GPU nodes' subnet"


def test_security_group_lets_lustre_through_to_itself_and_the_nodes(recording: Recording):
    sg = fsx_security_group(recording)
    for direction in ("ingress", "egress"):
        rules = sg.inputs[direction]
        for lo, hi in LUSTRE_PORTS:
            assert opens(rules, lo, hi, self_=True, group=CLUSTER_SG), (
                f"{sg.name} {direction}: TCP {lo}-{hi} not open to itself and the cluster security group")
        assert not [r for r in rules if r.get("cidrBlocks")], f"{sg.name} {direction}: open to a CIDR"
        assert {r["protocol"] for r in rules} == {"tcp"}, f"{sg.name} {direction}: more than Lustre"


def test_nodes_accept_lustre_from_the_file_servers(recording: Recording):
    """The client side: the cluster security group admits the file system's group on both ranges."""
    sg_id = f"{fsx_security_group(recording).name}-id"
    rules = [r.inputs for r in recording.of_type(SG_INGRESS)
             if r.inputs["securityGroupId"] == CLUSTER_SG and r.inputs.get("referencedSecurityGroupId") == sg_id]
    covered = {(int(r["fromPort"]), int(r["toPort"])) for r in rules if r["ipProtocol"] == "tcp"}
    assert covered == set(LUSTRE_PORTS), f"cluster security group admits {covered} from FSx"


def test_the_stack_exports_the_file_system_id(recording: Recording):
    assert recording.exports[Export.FSX_FILE_SYSTEM_ID] == f"{file_system(recording).name}-id"


# --------------------------------------------------------------------------- every stack: the CSI driver


def test_csi_driver_is_pinned_and_lands_on_the_gpu_nodes(recording: Recording):
    driver = release(recording, versions.FSX_CSI_DRIVER)
    pin = versions.FSX_CSI_DRIVER
    assert installs_pin(driver, pin), f"{driver.name}: {driver.inputs['chart']} {driver.inputs['version']}"
    assert all(part.isdigit() for part in pin.version.split(".")), f"{pin.chart} {pin.version}: not an exact version"
    assert driver.inputs["namespace"] == "kube-system"
    assert driver.provider and "cluster-k8s" in driver.provider, "in-cluster objects use the cluster's provider"
    node = driver.inputs["values"]["node"]
    assert node["tolerateAllTaints"] is True or tolerates(node["tolerations"], GPU_TAINT), (
        f"{driver.name}: the node plugin cannot run on the GPU nodes, so the job's volume never mounts")
    assert driver.inputs["values"]["controller"]["nodeSelector"] == SYSTEM_NODE_LABEL


def test_csi_driver_gets_no_aws_credentials_for_a_static_volume(recording: Recording, stack: str):
    """Checked against the FSx CSI driver's code paths: a static volume makes it call no FSx API
    (no CreateVolume / DeleteVolume without a StorageClass), so neither of its service accounts
    gets a Pod Identity role (``AmazonFSxFullAccess`` on the controller would be unused power). Its
    region comes from the chart's values: with IMDS closed to pods, its Kubernetes-API metadata
    fallback carries none (aws-fsx-csi-driver pkg/cloud/metadata_k8s.go)."""
    driver = release(recording, versions.FSX_CSI_DRIVER)
    values = driver.inputs["values"]
    accounts = {(driver.inputs["namespace"], values[part]["serviceAccount"]["name"]) for part in ("controller", "node")}
    granted = [(r.inputs["namespace"], r.inputs["serviceAccount"]) for r in recording.of_type(POD_IDENTITY)]
    assert not accounts & set(granted), f"FSx CSI service accounts with AWS credentials: {accounts & set(granted)}"
    region = stack_config(stack)["aws:region"]
    assert values["controller"]["region"] == values["node"]["region"] == region


# --------------------------------------------------------------------------- every stack: volume and claim


@pytest.mark.parametrize("type_", [PV, PVC])
def test_volume_and_claim_validate_strictly(recording: Recording, type_: str):
    """Checked against Kubernetes 1.33's OpenAPI schemas (kubernetes-validate, strict)."""
    (r,) = shared_claims(recording) if type_ == PVC else recording.of_type(type_)
    body = {"apiVersion": "v1", "kind": type_.rsplit(":", 1)[1], **plain(r.inputs)}
    kubernetes_validate.validate(body, "1.33", strict=True)


def test_volume_is_the_file_system_for_every_node(recording: Recording, stack: str):
    fs, pv = file_system(recording), volume(recording)
    csi = pv["spec"]["csi"]
    assert csi["driver"] == "fsx.csi.aws.com"
    assert csi["volumeHandle"] == f"{fs.name}-id", "the volume must name the file system by id"
    region = stack_config(stack)["aws:region"]
    assert csi["volumeAttributes"] == {"dnsname": f"{fs.name}-id.fsx.{region}.amazonaws.com",
                                       "mountname": "mockmnt1"}, "DNS and mount name come from the file system"
    assert pv["spec"]["accessModes"] == ["ReadWriteMany"], "every node mounts it at once"
    assert pv["spec"]["persistentVolumeReclaimPolicy"] == "Retain", "deleting the claim must not touch the data"
    assert pv["spec"]["capacity"]["storage"] == f"{storage_config(stack)['fsxStorageCapacityGiB']}Gi"
    assert {"flock", "relatime"} <= set(pv["spec"]["mountOptions"]), "the FSx user guide's mount options"


def test_claim_binds_only_that_volume_in_the_job_namespace(recording: Recording):
    pv, pvc = volume(recording), claim(recording)
    ns = job_of(recording)["metadata"]["namespace"]
    assert pvc["metadata"]["namespace"] == ns
    assert pvc["spec"]["volumeName"] == pv["metadata"]["name"]
    assert pv["spec"]["claimRef"] == {"namespace": ns, "name": pvc["metadata"]["name"]}
    assert pvc["spec"]["storageClassName"] == pv["spec"]["storageClassName"] == "", "no dynamic provisioning"
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    assert pvc["spec"]["resources"]["requests"]["storage"] == pv["spec"]["capacity"]["storage"]
    for r in (recording.one(PV), *shared_claims(recording)):
        assert r.provider and "cluster-k8s" in r.provider, f"{r.name}: not on the cluster's provider"


def test_claim_comes_after_its_namespace_and_volume_and_before_the_job(recording: Recording):
    (pvc,), job = shared_claims(recording), recording.one(PYTORCHJOB)
    assert {"training-job-namespace", recording.one(PV).name} <= set(pvc.dependencies), pvc.dependencies
    assert pvc.name in job.dependencies, "the job's pods would wait for a claim that does not exist yet"


# --------------------------------------------------------------------------- every stack: the job


def test_every_worker_mounts_the_claim_and_checkpoints_into_the_runs_directory(recording: Recording):
    job, pvc = job_of(recording), claim(recording)
    pod = worker(job)["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounted = [m for m in container(job)["volumeMounts"]
               if volumes[m["name"]].get("persistentVolumeClaim", {}).get("claimName") == pvc["metadata"]["name"]]
    assert len(mounted) == 1 and "subPath" not in mounted[0], mounted
    run_dir = f"{mounted[0]['mountPath']}/runs/{job['metadata']['name']}"
    flags = parse_flags(container(job)["command"])
    assert flags["--checkpoint-dir"].startswith(f"{run_dir}/"), f"checkpoints at {flags['--checkpoint-dir']}"
    assert flags["--output-dir"].startswith(f"{run_dir}/"), f"exported model at {flags['--output-dir']}"
    assert flags["--checkpoint-dir"] != flags["--output-dir"]


def test_cache_and_flight_recorder_stay_on_nvme(recording: Recording):
    """Per-node data stays per node: the Hugging Face cache and NCCL's hang dumps."""
    job = job_of(recording)
    pod = worker(job)["template"]["spec"]
    nvme = {v["name"] for v in pod["volumes"] if v.get("hostPath", {}).get("path") == "/mnt/k8s-disks/0"}
    nvme_paths = [m["mountPath"] for m in container(job)["volumeMounts"] if m["name"] in nvme]
    env = {e["name"]: e.get("value") for e in container(job)["env"]}
    for what, path in (("HF_HOME", env["HF_HOME"]), ("--cache-dir", parse_flags(container(job)["command"])["--cache-dir"]),
                       ("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"])):
        assert any(path.startswith(f"{p}/") for p in nvme_paths), f"{what} = {path} is not on NVMe"
        assert not path.startswith(shared_mount(recording)), f"{what} = {path} is on the shared file system"


def test_init_container_hands_the_run_directory_to_the_training_user(recording: Recording):
    """The file system's root is root's; the training user (uid 1000) must write its run's directory."""
    job = job_of(recording)
    pod = worker(job)["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == APP_UID
    (prepare,) = pod["initContainers"]
    assert prepare["securityContext"]["runAsUser"] == 0, "only root can chown on a root-owned file system"
    mount = shared_mount(recording)
    assert mount in [m["mountPath"] for m in prepare["volumeMounts"]], "the init container does not see /fsx"
    script = prepare["command"][-1]
    made, owned = script.split(" && ")
    assert made.startswith("mkdir -p ") and owned.startswith(f"chown {APP_UID}:{APP_UID} ")
    flags = parse_flags(container(job)["command"])
    run_dir = f"{mount}/runs/{job['metadata']['name']}"
    for path in (flags["--checkpoint-dir"], flags["--output-dir"]):
        assert path in made.split(), f"{path} is not created"
        assert path in owned.split(), f"{path} is not handed to uid {APP_UID}"
    assert run_dir in owned.split(), f"{run_dir} stays root's"
    assert mount not in owned.split() and f"{mount}/runs" not in owned.split(), "only the run's own directory"


# --------------------------------------------------------------------------- variants


@pytest.fixture(scope="module")
def single_node_recording() -> Recording:
    """p5 with storage off and a one-node job: the case where nothing changes (node-local NVMe)."""
    return variant("p5", storage={"fsx": False}, job={"nodes": 1})


def test_single_node_without_storage_keeps_checkpoints_on_nvme(single_node_recording: Recording):
    rec = single_node_recording
    for type_ in (FSX, PV):
        assert rec.of_type(type_) == [], f"{type_} created without shared storage"
    assert shared_claims(rec) == [], "a shared claim created without shared storage"
    assert [r for r in rec.of_type(HELM) if r.inputs["chart"] == f"./{versions.FSX_CSI_DRIVER.folder}"] == []
    assert Export.FSX_FILE_SYSTEM_ID not in rec.exports
    job = job_of(rec)
    pod = worker(job)["template"]["spec"]
    assert not [v for v in pod["volumes"] if "persistentVolumeClaim" in v]
    nvme = {v["name"] for v in pod["volumes"] if v.get("hostPath", {}).get("path") == "/mnt/k8s-disks/0"}
    flags = parse_flags(container(job)["command"])
    run_mount = [m for m in container(job)["volumeMounts"]
                 if m["name"] in nvme and m.get("subPath") == f"runs/{job['metadata']['name']}"]
    assert len(run_mount) == 1, "the run's NVMe directory"
    for flag in ("--checkpoint-dir", "--output-dir"):
        assert flags[flag].startswith(f"{run_mount[0]['mountPath']}/"), f"{flag} = {flags[flag]}"


def test_multi_node_without_shared_storage_is_refused():
    found = problems(raw("p5", fsx=False))
    assert "storage.fsx" in found, found
    message = found["storage.fsx"]
    assert "2 nodes" in message and "scattered" in message and "storage.fsx: true" in message


def test_an_elastic_job_that_may_grow_past_one_node_needs_shared_storage_too():
    config = raw("p5", fsx=False)
    config["job"].update(nodes=1, minNodes=1, maxNodes=2)
    assert "storage.fsx" in problems(config)


def test_one_node_without_shared_storage_is_fine():
    config = raw("p5", fsx=False)
    config["job"]["nodes"] = 1
    assert not parse(config).storage.shared


@pytest.mark.parametrize("gib", [1200, 2400, 4800, 9600])
def test_persistent_2_capacities_are_accepted(gib: int):
    assert parse(raw("p5", fsxStorageCapacityGiB=gib)).storage.fsx_storage_capacity_gib == gib


@pytest.mark.parametrize("gib", [0, 1000, 1800, 3600, 6000])
def test_other_capacities_are_refused(gib: int):
    """3600 is a multiple of 1200 but not a PERSISTENT_2 size (1200, 2400, then steps of 2400)."""
    found = problems(raw("p5", fsxStorageCapacityGiB=gib))
    assert f"storage.fsxStorageCapacityGiB = {gib}" in found.get("storage.fsxStorageCapacityGiB", ""), found


@pytest.mark.parametrize("throughput", sorted(PERSISTENT_2_THROUGHPUTS))
def test_persistent_2_throughputs_are_accepted(throughput: int):
    assert parse(raw("p4de", fsxThroughputPerTiB=throughput)).storage.fsx_throughput_per_tib == throughput


@pytest.mark.parametrize("throughput", [50, 100, 200, 2000])
def test_other_throughputs_are_refused(throughput: int):
    found = problems(raw("p4de", fsxThroughputPerTiB=throughput))
    assert "125, 250, 500, 1000" in found.get("storage.fsxThroughputPerTiB", ""), found


def test_fsx_on_an_existing_cluster_is_refused_with_the_alternative():
    config = raw("p5")
    config["cluster"]["existingClusterName"] = "research"
    message = problems(config)["storage.fsx"]
    assert "existingClaimName" in message


def test_fsx_and_an_existing_claim_are_one_or_the_other():
    assert "storage.existingClaimName" in problems(raw("p5", existingClaimName="checkpoints"))


def test_a_claim_name_must_be_a_kubernetes_name():
    assert "storage.existingClaimName" in problems(raw("p5", fsx=False, existingClaimName="Check_Points"))


def test_an_existing_cluster_mounts_the_claim_the_user_brings():
    rec = variant("p5", cluster={"existingClusterName": "research"},
                  storage={"fsx": False, "existingClaimName": "team-checkpoints"})
    assert rec.of_type(FSX) == [] and rec.of_type(PV) == [] and shared_claims(rec) == [], "nothing to create"
    job = job_of(rec)
    claims = [v["persistentVolumeClaim"]["claimName"] for v in worker(job)["template"]["spec"]["volumes"]
              if "persistentVolumeClaim" in v]
    assert claims == ["team-checkpoints"]
    flags = parse_flags(container(job)["command"])
    assert flags["--checkpoint-dir"].startswith(f"{shared_mount(rec)}/runs/{job['metadata']['name']}/")


def test_the_training_package_reads_the_shared_directories(recording: Recording):
    """Checked against the training package's own parser (training/config.py): the checkpoints and
    the export land where the job mounted the shared claim."""
    from training.config import build_parser, config_from_namespace

    job = job_of(recording)
    command = container(job)["command"]
    config = config_from_namespace(build_parser().parse_args(command[command.index("training.finetune") + 1:]))
    run_dir = f"{shared_mount(recording)}/runs/{job['metadata']['name']}"
    assert config.checkpoint.checkpoint_dir.startswith(f"{run_dir}/")
    assert config.checkpoint.output_dir.startswith(f"{run_dir}/")
