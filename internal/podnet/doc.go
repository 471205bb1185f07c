// Package podnet puts a VM on a pod's network: the network namespace that
// CNI set up for the pod sandbox (containerd's CRI plugin hands its path
// to the runtime in the sandbox's OCI spec), with the pod's interface,
// usually a veth called eth0 whose peer is on the node's bridge.
//
// Data flow, as Kata Containers' "tcfilter" mode does it:
//
//	Inspect (iface.go): the namespace's interface → Interface (MAC,
//	    IPv4 address, gateway, MTU), read over netlink
//	the runtime: a TAP in the namespace (virtio-net's OpenTAPIn) and a VM
//	    whose guest takes the interface's MAC and, through Interface.KernelArg,
//	    its address and gateway, so the guest is the pod on the wire
//	Redirect (redirect.go): the TAP up with the interface's MTU; an ingress
//	    qdisc on each of the two, with a u32 filter that matches every
//	    frame and a mirred action that sends it out of the other:
//
//	node bridge ─ veth peer ═ eth0 ─(ingress → egress)─▶ TAP ─▶ guest eth0
//	guest eth0 ─▶ TAP ─(ingress → egress)─▶ eth0 ═ veth peer ─ node bridge
//
// The namespace's own stack never sees the pod's frames; its address stays
// on eth0, as CNI left it, so CNI's CHECK and DEL work unchanged. Nothing
// here needs undoing: the TAP goes when the VM closes its descriptor, and
// the filters go with their interfaces when CNI deletes the namespace.
//
// Every call opens its own netlink handle bound to the namespace, so no
// goroutine or thread of the caller enters it.
package podnet
