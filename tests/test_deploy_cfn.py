"""deploy/cfn-gpu-serving.yaml: cfn-lint clean, and the properties the deployment promises:
parameters (no open default CIDR, allowed GPU instance types), the security group (8000 and
only with a key 22, from AllowedCidr only), least-privilege IAM, IMDSv2, an encrypted gp3 root,
the creation policy and the outputs."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import pytest
from deploy_helpers import TEMPLATE, load_template

T = load_template()
P = T["Parameters"]
R = T["Resources"]

GPU_FAMILIES = ("g5", "g6", "g6e", "p4d", "p5")
SIZES = ("xlarge", "2xlarge", "4xlarge", "8xlarge", "12xlarge", "16xlarge", "24xlarge", "48xlarge")


def _needs_cfn_lint():
    if importlib.util.find_spec("cfnlint") is None:
        if os.environ.get("S4KV_REQUIRE_VLLM"):  # the nox tests session: cfn-lint is a TEST_DEP
            pytest.fail("cfn-lint is not installed in the tests venv")
        pytest.skip("cfn-lint not installed")


def test_cfn_lint_clean():
    _needs_cfn_lint()
    r = subprocess.run([sys.executable, "-c", "import sys; from cfnlint.runner import main; sys.exit(main())",
                        "--include-checks", "I", "--", str(TEMPLATE)],
                       capture_output=True, text=True, check=False, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "", r.stdout + r.stderr


def test_parameters():
    assert set(P) >= {"ModelId", "InstanceType", "ImageId", "VpcId", "SubnetId", "AllowedCidr",
                      "KeyName", "HfTokenSecretArn", "ApiKeySecretArn", "MaxModelLen", "GpuMemoryUtilization"}
    assert P["ModelId"]["Default"] == "Qwen/Qwen2.5-7B-Instruct"
    assert P["ImageId"]["Type"] == "AWS::EC2::Image::Id" and "Default" not in P["ImageId"]
    assert P["VpcId"]["Type"] == "AWS::EC2::VPC::Id"
    assert P["SubnetId"]["Type"] == "AWS::EC2::Subnet::Id"
    assert P["KeyName"]["Default"] == "" and P["HfTokenSecretArn"]["Default"] == ""
    assert P["ApiKeySecretArn"]["Default"] == ""  # but required once a port is open (the Rule)
    assert P["MaxModelLen"]["Type"] == "Number" and P["GpuMemoryUtilization"]["Type"] == "Number"
    assert 0 < P["GpuMemoryUtilization"]["MaxValue"] < 1
    assert P["RootVolumeSize"]["MinValue"] >= 100


def test_allowed_cidr_has_no_default_and_refuses_wide_prefixes():
    cidr = P["AllowedCidr"]
    assert "Default" not in cidr
    pattern = re.compile(cidr["AllowedPattern"])
    for ok in ("203.0.113.7/32", "10.0.0.0/8", "172.16.0.0/12", "192.168.1.0/24", "100.64.0.0/10"):
        assert pattern.fullmatch(ok), ok
    # the world and everything near it: a string match on 0.0.0.0/0 let 0.0.0.0/1 through
    for prefix in range(8):
        for net in ("0.0.0.0", "128.0.0.0", "10.0.0.0"):
            assert not pattern.fullmatch(f"{net}/{prefix}"), f"{net}/{prefix}"
    assert not pattern.fullmatch("0.0.0.0/00") and not pattern.fullmatch("0.0.0.0/07")
    for bad in ("203.0.113.7", "10.0.0.0/33", "256.1.1.1/32", "::/0", "10.0.0.0/8 ", "10.0.0.0/8\n"):
        assert not pattern.fullmatch(bad), bad
    assert pattern.fullmatch("")  # no port open: SSM port forwarding only


def _eval(expr, params: dict[str, str]):
    """The intrinsics the template's Rules use, evaluated for a set of parameter values."""
    if isinstance(expr, dict):
        (fn, arg), = expr.items()
        if fn == "Ref":
            return params.get(arg, P[arg].get("Default"))
        if fn == "Fn::Equals":
            return _eval(arg[0], params) == _eval(arg[1], params)
        if fn == "Fn::Not":
            return not _eval(arg[0], params)
        if fn == "Fn::And":
            return all(_eval(a, params) for a in arg)
        raise AssertionError(f"unexpected intrinsic {fn} in Rules")
    return expr


def _rules_refuse(**params) -> list[str]:
    refused = []
    for name, rule in T["Rules"].items():
        if "RuleCondition" in rule and not _eval(rule["RuleCondition"], params):
            continue
        refused += [name for a in rule["Assertions"] if not _eval(a["Assert"], params)]
    return refused


KEY_ARN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:s4kv-api-key-AbC123"


def test_an_open_port_needs_the_api_key():
    # port 8000 reachable from a CIDR without a key: the stack refuses to be created
    assert _rules_refuse(AllowedCidr="203.0.113.7/32") == ["ReachableEndpointNeedsApiKey"]
    assert _rules_refuse(AllowedCidr="203.0.113.7/32", ApiKeySecretArn=KEY_ARN) == []
    # nothing open: SSM port forwarding, the key optional
    assert _rules_refuse(AllowedCidr="") == [] and _rules_refuse(AllowedCidr="", ApiKeySecretArn=KEY_ARN) == []
    # SSH needs a CIDR to open 22 to
    assert _rules_refuse(AllowedCidr="", KeyName="my-key") == ["SshNeedsAllowedCidr"]
    assert _rules_refuse(AllowedCidr="10.0.0.0/16", KeyName="my-key", ApiKeySecretArn=KEY_ARN) == []
    assert set(P["ApiKeySecretArn"]["AllowedPattern"].split("|")) == set(P["HfTokenSecretArn"]["AllowedPattern"].split("|"))


def test_model_id_and_secret_patterns_keep_user_data_safe():
    model = re.compile(P["ModelId"]["AllowedPattern"])
    assert model.fullmatch("Qwen/Qwen2.5-7B-Instruct") and model.fullmatch("gpt2")
    for bad in ("a/b/c", "x'; reboot; '", "a b", "$(id)", "a/b\nc"):
        assert not model.fullmatch(bad)
    arn = re.compile(P["HfTokenSecretArn"]["AllowedPattern"])
    assert arn.fullmatch("") and arn.fullmatch("arn:aws:secretsmanager:us-east-1:123456789012:secret:hf-AbC123")
    assert not arn.fullmatch("arn:aws:secretsmanager:us-east-1:123456789012:secret:x' ; id")
    assert not arn.fullmatch("*")


def test_instance_types_are_gpu_families_only():
    allowed = P["InstanceType"]["AllowedValues"]
    assert P["InstanceType"]["Default"] in allowed
    for t in allowed:
        family, size = t.split(".")
        assert family in GPU_FAMILIES and size in SIZES, t
    for family in ("g5", "g6", "g6e"):
        assert {f"{family}.{s}" for s in SIZES} <= set(allowed)
    assert {"p4d.24xlarge", "p5.48xlarge"} <= set(allowed)


def _ingress():
    rules = []
    for rule in R["SecurityGroup"]["Properties"]["SecurityGroupIngress"]:
        if "Fn::If" in rule:
            cond, then, other = rule["Fn::If"]
            assert other == {"Ref": "AWS::NoValue"}
            rules.append((cond, then))
        else:
            rules.append((None, rule))
    return rules


def test_security_group():
    rules = _ingress()
    ports = {(r["FromPort"], r["ToPort"]): cond for cond, r in rules}
    assert ports == {(8000, 8000): "HasAllowedCidr", (22, 22): "OpenSsh"}  # nothing open by itself
    for _, r in rules:
        assert r["IpProtocol"] == "tcp"
        assert r["CidrIp"] == {"Ref": "AllowedCidr"}
        assert "CidrIpv6" not in r
    c = T["Conditions"]
    assert c["HasKeyName"] == {"Fn::Not": [{"Fn::Equals": [{"Ref": "KeyName"}, ""]}]}
    assert c["HasAllowedCidr"] == {"Fn::Not": [{"Fn::Equals": [{"Ref": "AllowedCidr"}, ""]}]}
    # (the test loader spells !Condition as Fn::Condition; CloudFormation's long form is {"Condition": ...})
    assert c["OpenSsh"] == {"Fn::And": [{"Fn::Condition": "HasKeyName"}, {"Fn::Condition": "HasAllowedCidr"}]}
    egress = R["SecurityGroup"]["Properties"]["SecurityGroupEgress"]
    assert [(e["IpProtocol"], e["FromPort"], e["ToPort"]) for e in egress] == [("tcp", 443, 443)]


def _statements():
    role = R["InstanceRole"]["Properties"]
    out = []
    for policy in role["Policies"]:
        cond = None
        if "Fn::If" in policy:
            cond, policy, other = policy["Fn::If"]
            assert other == {"Ref": "AWS::NoValue"}
        for st in policy["PolicyDocument"]["Statement"]:
            out.append((cond, st))
    return out


# What the SSM agent calls (Session Manager: shell and port forwarding; Run Command). None of
# these takes a resource ARN, so "*" is their only resource; nothing else may have it.
SSM_AGENT_ACTIONS = {
    "SsmAgentRegister": ["ssm:UpdateInstanceInformation"],
    "SessionManagerChannels": ["ssmmessages:CreateControlChannel", "ssmmessages:CreateDataChannel",
                               "ssmmessages:OpenControlChannel", "ssmmessages:OpenDataChannel"],
    "SsmAgentMessages": ["ec2messages:AcknowledgeMessage", "ec2messages:DeleteMessage",
                         "ec2messages:FailMessage", "ec2messages:GetEndpoint", "ec2messages:GetMessages",
                         "ec2messages:SendReply"],
}


def _actions(st) -> list[str]:
    return st["Action"] if isinstance(st["Action"], list) else [st["Action"]]


def test_iam_least_privilege():
    role = R["InstanceRole"]["Properties"]
    assert role["AssumeRolePolicyDocument"]["Statement"] == [
        {"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}]
    # no managed policy: AmazonSSMManagedInstanceCore grants ssm:GetParameter(s) on every parameter
    assert "ManagedPolicyArns" not in role
    statements = _statements()
    by_sid = {st["Sid"]: (cond, st) for cond, st in statements}
    assert set(by_sid) == {"WriteOwnLogGroup", "ReadHfTokenSecret", "ReadApiKeySecret", *SSM_AGENT_ACTIONS}
    for cond, st in statements:
        assert st["Effect"] == "Allow"
        assert all("*" not in a for a in _actions(st)), st
        assert "NotAction" not in st and "NotResource" not in st and "Condition" not in st
        if st["Sid"] in SSM_AGENT_ACTIONS:
            assert cond is None and st["Resource"] == "*"
            assert sorted(_actions(st)) == sorted(SSM_AGENT_ACTIONS[st["Sid"]])
        else:
            assert st["Resource"] != "*" and "*" not in str(st["Resource"]), st
    granted = {a for _, st in statements for a in _actions(st)}
    assert not {a for a in granted if a.startswith("ssm:")} - {"ssm:UpdateInstanceInformation"}
    cond, logs = by_sid["WriteOwnLogGroup"]
    assert cond is None
    assert sorted(logs["Action"]) == ["logs:CreateLogStream", "logs:DescribeLogStreams", "logs:PutLogEvents"]
    assert logs["Resource"] == {"Fn::GetAtt": ["LogGroup", "Arn"]}
    cond, secret = by_sid["ReadHfTokenSecret"]
    assert cond == "HasHfToken"
    assert secret["Action"] == "secretsmanager:GetSecretValue"
    assert secret["Resource"] == {"Ref": "HfTokenSecretArn"}
    cond, secret = by_sid["ReadApiKeySecret"]
    assert cond == "HasApiKey" and secret["Action"] == "secretsmanager:GetSecretValue"
    assert secret["Resource"] == {"Ref": "ApiKeySecretArn"}
    assert R["InstanceProfile"]["Properties"]["Roles"] == [{"Ref": "InstanceRole"}]


def test_instance_imdsv2_encrypted_gp3_root():
    props = R["Instance"]["Properties"]
    md = props["MetadataOptions"]
    assert md["HttpTokens"] == "required" and md["HttpPutResponseHopLimit"] == 1
    assert md["HttpEndpoint"] == "enabled"
    (bdm,) = props["BlockDeviceMappings"]
    assert bdm["DeviceName"] == {"Ref": "RootDeviceName"}
    assert bdm["Ebs"] == {"VolumeType": "gp3", "VolumeSize": {"Ref": "RootVolumeSize"},
                          "Encrypted": True, "DeleteOnTermination": True}
    assert props["IamInstanceProfile"] == {"Ref": "InstanceProfile"}
    assert props["InstanceType"] == {"Ref": "InstanceType"} and props["ImageId"] == {"Ref": "ImageId"}
    (nic,) = props["NetworkInterfaces"]
    assert nic["GroupSet"] == [{"Ref": "SecurityGroup"}] and nic["SubnetId"] == {"Ref": "SubnetId"}
    assert props["KeyName"] == {"Fn::If": ["HasKeyName", {"Ref": "KeyName"}, {"Ref": "AWS::NoValue"}]}


def _iso_minutes(duration: str) -> int:
    m = re.fullmatch(r"PT(?:(\d+)H)?(?:(\d+)M)?", duration)
    return int(m.group(1) or 0) * 60 + int(m.group(2) or 0)


def test_creation_policy_and_user_data():
    inst = R["Instance"]
    assert inst["CreationPolicy"]["ResourceSignal"]["Count"] == 1
    timeout_min = _iso_minutes(inst["CreationPolicy"]["ResourceSignal"]["Timeout"])
    text = inst["Properties"]["UserData"]["Fn::Base64"]["Fn::Sub"]
    assert text.startswith("#!/bin/bash\n")
    wait_s = int(re.search(r"--timeout (\d+)", text).group(1))
    # the instance gives up (and signals FAILURE with the reason) before CloudFormation does
    assert wait_s + 5 * 60 <= timeout_min * 60
    assert "s4kv-bootstrap boot" in text
    for param in ("ModelId", "MaxModelLen", "GpuMemoryUtilization", "HfTokenSecretArn", "ApiKeySecretArn",
                  "LogGroup"):
        assert f"'${{{param}}}'" in text, param
    assert "--port 8000" in text  # the port the security group opens and the outputs name
    assert "--stack '${AWS::StackName}' --resource Instance --region '${AWS::Region}'" in text
    for name in re.findall(r"\$\{([A-Za-z]+)\}", text):
        assert name in P or name in R, name


def test_log_group_survives_rollback():
    lg = R["LogGroup"]
    assert lg["DeletionPolicy"] == "Retain" and lg["Properties"]["RetentionInDays"] > 0
    assert "LogGroupName" not in lg["Properties"]  # generated: no clash when re-creating the stack


def test_outputs():
    out = T["Outputs"]
    for key, suffix in (("EndpointUrl", ":8000/v1"), ("HealthUrl", ":8000/health")):
        cond, public, private = out[key]["Value"]["Fn::If"]
        assert cond == "UsePublicIp"
        assert public["Fn::Sub"] == "http://${Instance.PublicIp}" + suffix
        assert private["Fn::Sub"] == "http://${Instance.PrivateIp}" + suffix
    assert out["LogGroupName"]["Value"] == {"Ref": "LogGroup"}
    # reaching the endpoint without an open port or a public IP: SSM port forwarding, one command
    cmd = out["SsmPortForwardCommand"]["Value"]["Fn::Sub"]
    assert "\n" not in cmd.strip()  # folded into one line: copy, paste, run
    assert cmd.split() == ["aws", "ssm", "start-session", "--region", "${AWS::Region}", "--target", "${Instance}",
                           "--document-name", "AWS-StartPortForwardingSession", "--parameters",
                           '\'{"portNumber":["8000"],"localPortNumber":["8000"]}\'']
    assert out["LocalEndpointUrl"]["Value"] == "http://127.0.0.1:8000/v1"
