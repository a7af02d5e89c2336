"""The VPC: public subnets with one NAT gateway per AZ, private subnets for the nodes.

Or, when the stack names an existing VPC, just its subnet ids. Either way the component's
outputs are the same three lists, so the cluster does not care which.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from components.settings import MAX_AVAILABILITY_ZONES, NetworkSettings


@dataclass(frozen=True, kw_only=True)
class NetworkArgs:
    """Inputs of ``Network``."""

    name: str
    """Prefix of physical names; also the EKS cluster name the subnets are tagged for."""
    settings: NetworkSettings
    gpu_availability_zone: str
    """The AZ of the GPU nodes: its private subnet is singled out."""
    region: str
    """AWS region, for the S3 gateway endpoint's service name."""


@dataclass(frozen=True)
class SubnetPlan:
    """CIDRs of one AZ."""

    availability_zone: str
    private_cidr: str
    public_cidr: str


def plan_subnets(vpc_cidr: str, availability_zones: tuple[str, ...]) -> list[SubnetPlan]:
    """Split the VPC into large private subnets (pods take VPC IPs) and small public ones.

    The VPC is cut in eight; each AZ gets one eighth as its private subnet (a /19 of a /16:
    8,187 addresses, room for 16 p5 nodes with their pods), and the last eighth is cut again
    into small public subnets for the NAT gateways and load balancers.
    """
    vpc = ipaddress.ip_network(vpc_cidr)
    eighths = list(vpc.subnets(prefixlen_diff=3))
    if len(availability_zones) > MAX_AVAILABILITY_ZONES:
        raise ValueError(f"at most {MAX_AVAILABILITY_ZONES} availability zones fit this subnet plan")
    publics = list(eighths[7].subnets(prefixlen_diff=3))
    return [
        SubnetPlan(az, str(eighths[i]), str(publics[i])) for i, az in enumerate(availability_zones)
    ]


class Network(pulumi.ComponentResource):
    """A VPC for EKS, or the ids of an existing one."""

    vpc_id: pulumi.Output[str]
    private_subnet_ids: pulumi.Output[list[str]]
    public_subnet_ids: pulumi.Output[list[str]]
    gpu_subnet_ids: pulumi.Output[list[str]]

    def __init__(self, name: str, args: NetworkArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("fsdp-eks:network:Network", name, None, opts)
        s = args.settings
        if s.existing_vpc_id is not None:
            self.vpc_id = pulumi.Output.from_input(s.existing_vpc_id)
            self.private_subnet_ids = pulumi.Output.from_input(list(s.existing_private_subnet_ids))
            self.public_subnet_ids = pulumi.Output.from_input(list(s.existing_public_subnet_ids))
            self.gpu_subnet_ids = pulumi.Output.from_input(list(s.existing_gpu_subnet_ids))
        else:
            self._create(name, args)
        self.register_outputs(
            {
                "vpc_id": self.vpc_id,
                "private_subnet_ids": self.private_subnet_ids,
                "public_subnet_ids": self.public_subnet_ids,
                "gpu_subnet_ids": self.gpu_subnet_ids,
            }
        )

    def _create(self, name: str, args: NetworkArgs) -> None:
        child = pulumi.ResourceOptions(parent=self)
        vpc = aws.ec2.Vpc(
            f"{name}-vpc",
            cidr_block=args.settings.vpc_cidr,
            enable_dns_hostnames=True,
            enable_dns_support=True,
            tags={"Name": args.name},
            opts=child,
        )
        igw = aws.ec2.InternetGateway(f"{name}-igw", vpc_id=vpc.id, tags={"Name": args.name}, opts=child)
        public_rt = aws.ec2.RouteTable(
            f"{name}-public",
            vpc_id=vpc.id,
            routes=[aws.ec2.RouteTableRouteArgs(cidr_block="0.0.0.0/0", gateway_id=igw.id)],
            tags={"Name": f"{args.name}-public"},
            opts=child,
        )
        private_route_tables, private, public, gpu = [], [], [], []
        for plan in plan_subnets(args.settings.vpc_cidr, args.settings.availability_zones):
            az = plan.availability_zone
            pub = self._subnet(name, args, vpc, "public", az, plan.public_cidr, public_rt)
            rt = self._private_route_table(name, args, vpc, igw, az, pub)
            priv = self._subnet(name, args, vpc, "private", az, plan.private_cidr, rt)
            private_route_tables.append(rt)
            private.append(priv.id)
            public.append(pub.id)
            if az == args.gpu_availability_zone:
                gpu.append(priv.id)
        # Checkpoints and datasets on S3 bypass the NAT gateways (no per-GB NAT charge).
        aws.ec2.VpcEndpoint(
            f"{name}-s3",
            vpc_id=vpc.id,
            service_name=f"com.amazonaws.{args.region}.s3",
            vpc_endpoint_type="Gateway",
            route_table_ids=[rt.id for rt in private_route_tables],
            opts=child,
        )
        self.vpc_id = vpc.id
        self.private_subnet_ids = pulumi.Output.all(*private)
        self.public_subnet_ids = pulumi.Output.all(*public)
        self.gpu_subnet_ids = pulumi.Output.all(*gpu)

    def _private_route_table(
        self, name: str, args: NetworkArgs, vpc: aws.ec2.Vpc, igw: aws.ec2.InternetGateway, az: str,
        public_subnet: aws.ec2.Subnet,
    ) -> aws.ec2.RouteTable:
        """The AZ's NAT gateway (in its public subnet) and the private route table through it.
        One NAT per AZ: image pulls and dataset downloads of the GPU nodes stay in their AZ."""
        child = pulumi.ResourceOptions(parent=self)
        eip = aws.ec2.Eip(f"{name}-nat-{az}", domain="vpc", tags={"Name": f"{args.name}-nat-{az}"}, opts=child)
        nat = aws.ec2.NatGateway(
            f"{name}-nat-{az}",
            subnet_id=public_subnet.id,
            allocation_id=eip.id,
            tags={"Name": f"{args.name}-{az}"},
            opts=pulumi.ResourceOptions(parent=self, depends_on=[igw]),
        )
        return aws.ec2.RouteTable(
            f"{name}-private-{az}",
            vpc_id=vpc.id,
            routes=[aws.ec2.RouteTableRouteArgs(cidr_block="0.0.0.0/0", nat_gateway_id=nat.id)],
            tags={"Name": f"{args.name}-private-{az}"},
            opts=child,
        )

    def _subnet(
        self, name: str, args: NetworkArgs, vpc: aws.ec2.Vpc, kind: str, az: str, cidr: str,
        route_table: aws.ec2.RouteTable,
    ) -> aws.ec2.Subnet:
        """A public or private subnet of one AZ, tagged for EKS, with its route table."""
        child = pulumi.ResourceOptions(parent=self)
        # Load balancers: internet-facing ones go to `elb` subnets, internal ones to `internal-elb`.
        role = {"public": "kubernetes.io/role/elb", "private": "kubernetes.io/role/internal-elb"}[kind]
        subnet = aws.ec2.Subnet(
            f"{name}-{kind}-{az}",
            vpc_id=vpc.id,
            cidr_block=cidr,
            availability_zone=az,
            map_public_ip_on_launch=kind == "public" or None,
            tags={"Name": f"{args.name}-{kind}-{az}", role: "1", f"kubernetes.io/cluster/{args.name}": "shared"},
            opts=child,
        )
        aws.ec2.RouteTableAssociation(f"{name}-{kind}-{az}", subnet_id=subnet.id, route_table_id=route_table.id, opts=child)
        return subnet
