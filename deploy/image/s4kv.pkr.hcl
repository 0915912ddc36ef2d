# S4 KV machine image: the AWS Deep Learning Base GPU AMI (Amazon Linux 2023, NVIDIA driver and
# CUDA installed) + provision.sh (patched vLLM and s4kv from dist/, the s4kv-serve unit, the
# CloudWatch agent config). The result is the ImageId of deploy/cfn-gpu-serving.yaml.
#
#   nox -s build-vllm-s4kv                       # dist/: vllm-<v>+s4kv.<N>-*.whl, s4kv-*.whl
#   nox -s image-constraints -- 0.33.0           # deploy/image/constraints/vllm-0.33.0.txt (hashed)
#   cd deploy/image && packer init . && packer build -var region=us-east-1 .
#
# Building needs AWS credentials allowed to run Packer's amazon-ebs builder.

packer {
  required_plugins {
    amazon = {
      source  = "github.com/hashicorp/amazon"
      version = ">= 1.3.0"
    }
  }
}

variable "region" {
  type    = string
  default = "us-east-1"
}

variable "instance_type" {
  type        = string
  default     = "g5.xlarge"
  description = "Build instance; a GPU type lets the build check that torch sees the GPU."
}

# The default is the newest release of deploy/GPU_VERIFIED (tests/test_deploy_versions.py checks
# it): the kernels of that release passed the GPU tests.
variable "vllm_version" {
  type        = string
  default     = "0.33.0"
  description = "Which patched vLLM release of dist/ goes into the image (a VERSIONS entry listed in deploy/GPU_VERIFIED)."
}

variable "allow_unverified_vllm" {
  type        = bool
  default     = false
  description = "Build a vllm_version that is not in deploy/GPU_VERIFIED (its kernels never passed the GPU tests); provision.sh refuses it otherwise."
}

variable "dist_dir" {
  type    = string
  default = "../../dist"
}

variable "volume_size" {
  type        = number
  default     = 100
  description = "GiB of the image's root snapshot (the stack's RootVolumeSize must be at least this)."
}

variable "subnet_id" {
  type    = string
  default = null
}

variable "ami_name_prefix" {
  type    = string
  default = "s4kv-vllm"
}

locals {
  timestamp = regex_replace(timestamp(), "[- TZ:]", "")
  # The first field of every non-comment line of deploy/GPU_VERIFIED (for the AMI's tag; the
  # refusal itself is provision.sh's, which reads the same file on the build instance).
  gpu_verified  = flatten(regexall("(?m)^([0-9]+(?:\\.[0-9]+)*)[ \\t]", file("${path.root}/../GPU_VERIFIED")))
  vllm_verified = contains(local.gpu_verified, var.vllm_version)
  # The hashed constraints provision.sh installs from (nox -s image-constraints writes them):
  # file() fails the build here, before an instance is launched, when they are missing.
  constraints = file("${path.root}/constraints/vllm-${var.vllm_version}.txt")
  wheels = concat(
    [for f in fileset(var.dist_dir, "vllm-${var.vllm_version}+s4kv.*.whl") : "${var.dist_dir}/${f}"],
    [for f in fileset(var.dist_dir, "s4kv-*.whl") : "${var.dist_dir}/${f}"],
  )
}

source "amazon-ebs" "s4kv" {
  region        = var.region
  source_ami_filter {
    owners      = ["amazon"]
    most_recent = true
    filters = {
      name                = "Deep Learning Base OSS Nvidia Driver GPU AMI (Amazon Linux 2023) *"
      architecture        = "x86_64"
      virtualization-type = "hvm"
      root-device-type    = "ebs"
    }
  }
  instance_type = var.instance_type
  subnet_id     = var.subnet_id
  ssh_username  = "ec2-user"
  ami_name        = "${var.ami_name_prefix}-${var.vllm_version}-${local.timestamp}"
  ami_description = "S4 KV: patched vLLM ${var.vllm_version} (int4_kivi KV cache) + s4kv, s4kv-serve.service"

  # Only the builder's own IP may reach the temporary instance over SSH.
  temporary_security_group_source_public_ip = true

  imds_support = "v2.0"
  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
  }

  encrypt_boot = true
  launch_block_device_mappings {
    device_name           = "/dev/xvda"
    volume_size           = var.volume_size
    volume_type           = "gp3"
    encrypted             = true
    delete_on_termination = true
  }

  tags = {
    Name              = "${var.ami_name_prefix}-${var.vllm_version}"
    s4kv-vllm         = var.vllm_version
    s4kv-gpu-verified = local.vllm_verified ? "yes" : "no"
    s4kv-constraints  = sha256(local.constraints)
    s4kv-base         = "{{ .SourceAMI }}"
  }
}

build {
  sources = ["source.amazon-ebs.s4kv"]

  provisioner "shell" {
    inline = ["mkdir -p /tmp/s4kv/dist /tmp/s4kv/deploy/image"]
  }

  provisioner "file" {
    sources     = local.wheels
    destination = "/tmp/s4kv/dist/"
  }

  provisioner "file" {
    source      = "${path.root}/"
    destination = "/tmp/s4kv/deploy/image"
  }

  provisioner "file" {
    source      = "${path.root}/../README.md"
    destination = "/tmp/s4kv/deploy/README.md"
  }

  provisioner "file" {
    source      = "${path.root}/../GPU_VERIFIED"
    destination = "/tmp/s4kv/deploy/GPU_VERIFIED"
  }

  provisioner "shell" {
    inline = [
      "sudo bash /tmp/s4kv/deploy/image/provision.sh --wheels /tmp/s4kv/dist --vllm-dist vllm --vllm-version ${var.vllm_version}${var.allow_unverified_vllm ? " --allow-unverified" : ""}",
      "sudo /opt/s4kv/venv/bin/python -c 'import torch, vllm, s4kv; print(vllm.__version__, torch.cuda.is_available())'",
      "sudo rm -rf /tmp/s4kv",
    ]
  }

  post-processor "manifest" {
    output     = "packer-manifest.json"
    strip_path = true
  }
}
