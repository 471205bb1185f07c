// Package usernet is a VM's network without root: a user-mode TCP/IP
// stack on the host side of the virtio-net device, with DHCP, DNS and NAT
// out through the host's own sockets, and host ports published into the
// guest. No TAP, bridge, iptables rule or capability is involved.
//
// The stack is gvisor-tap-vsock's virtual network (the one podman machine
// and CRC use): a gVisor netstack behind a virtual switch, assembled here
// from its parts (stack.go) so that microvm's own forwarders, which ask
// the policy first, take the guest's TCP and UDP. microvm runs it
// in a process of its own (cmd/microvm-net, on NewOnSocket) and connects
// the virtio-net device to the switch over a SOCK_SEQPACKET socketpair, one Ethernet frame per record (the switch's "bess" protocol;
// virtionet.NewSocket on the device's end). Not SOCK_DGRAM (the "vfkit"
// protocol): Linux queues at most net.unix.max_dgram_qlen, 10 by default,
// datagrams on it, which stalls TCP (13 MB/s instead of hundreds in
// bench/usernet).
//
// # A frame's path
//
// Guest to world: the driver's TX frame -> virtio-net TX worker -> one
// record on the socketpair -> the switch's reader goroutine -> the
// netstack. DHCP (UDP 67) and DNS (UDP/TCP 53 at GatewayIP) are answered
// by servers on the stack; a TCP connection or UDP flow to any other
// address is terminated in the stack and handed to the policy
// (Config.HostLoopback and Config.Egress, package netpolicy), which maps
// HostIP to 127.0.0.1 when host-loopback is on and decides on the address
// that would be dialled; a refused connection gets an RST, a refused
// flow's datagrams are dropped, and both count in Stats.Refused. An
// allowed one is re-originated by the host process with an ordinary
// socket (connect(2) to that address and port). World to guest runs
// the other way: the host socket's data is written into the stack's
// connection, which frames it towards the guest's MAC -> one record ->
// the virtio-net RX worker -> an RX chain.
//
// Published ports (Config.Publish): a host listener per port; each
// accepted connection (TCP) or client address (UDP) gets a connection
// from the stack to GuestIP:GuestPort, and bytes are copied both ways.
//
// # Addresses
//
//	192.168.127.0/24  Subnet
//	192.168.127.1     GatewayIP: default route, DHCP and DNS server
//	192.168.127.2     GuestIP: the guest's lease (a static lease on its MAC)
//	192.168.127.254   HostIP: the host's 127.0.0.1 with HostLoopback; host.microvm.internal
//
// What the guest may reach (netpolicy.Policy.Decide): by default every
// address but the blocked ranges (0.0.0.0/8, loopback, link-local and
// cloud metadata, multicast and reserved, the network's own range) and
// the host's own addresses; HostIP and the host's addresses only with
// HostLoopback; with Egress restricted, only its rules' addresses and
// ports (a rule lying inside the link-local or metadata ranges opens
// them). DNS at GatewayIP and published ports are the stack's own and
// inbound, so no address policy applies to them.
//
// DNS (dns.go) answers the names of the microvm.internal zone (HostName,
// gateway.microvm.internal; NXDOMAIN for the rest of it) from its own
// records, and looks every other name up with the host's resolver, which
// asks the host's DNS servers: the query is fully qualified, and Go's
// resolver does not look those up in the host's /etc/hosts. A lookup is
// egress (data can leave in the name asked): under a restricted Egress
// without its dns rule (netpolicy.Egress.LooksUpNames) the server answers
// its zone and refuses every other question itself.
//
// A frame from the guest reaches the switch only through the virtio-net
// device, which refuses frames shorter than an Ethernet header (the
// switch would index past them).
//
// # Goroutines and lifetime
//
// New starts the stack's own goroutines (the switch's reader for the
// socketpair, the DHCP and DNS servers, one per published listener and
// per forwarded connection or UDP flow). The policy is read-only after
// New; its counters are atomics. Close stops the reader (the socketpair is
// closed) and the listeners; gvisor-tap-vsock has no way to stop its
// DHCP and DNS servers, so those two goroutines and the stack's memory
// stay until the process exits: nothing for microvm-net, which serves one
// network, and a few KiB per network for a Go program that runs many in
// process (New).
package usernet
