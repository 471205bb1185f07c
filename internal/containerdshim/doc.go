// Package containerdshim is microvm's containerd runtime,
// io.containerd.microvm.v2 (cmd/containerd-shim-microvm-v2): containerd's
// shim v2 task API served over ttrpc, each VM carried by one shim process.
//
// The shim library is containerd 1.7's runtime/v2/shim: its start action
// prints the socket address as plain text, which every containerd from 1.6
// (Debian 12's) to 2.x reads; 2.x's pkg/shim prints a JSON bootstrap
// record that containerd 1.6 cannot parse.
//
// Data flow of one container (ctr run, or kubelet through CRI):
//
//	containerd ── exec "shim start" in the bundle ──▶ Manager.Start (manager.go)
//	    groups by the CRI sandbox annotation, starts the daemon (fd 3: its socket),
//	    prints the address
//	containerd ── ttrpc Create ──▶ Service.Create (service.go)
//	    readSpec/checkSpec/execStart (container.go, spec.go): OCI spec → agent ExecStart
//	    mountRootfs (rootfs.go): snapshot mounts → BUNDLE/rootfs
//	    podRootfsMethod (rootfs.go): the pod's RootfsMethod, ext4 or 9p
//	    the pod's first container: makeShareDir (volumes.go), and under ext4
//	        writeExt4 → ext4 (mkfs.ext4 -d); then bootSandbox (sandbox.go):
//	        microvm.Machine in this process, the agent's initramfs, the ext4
//	        as the root under a tmpfs overlay (9p: an empty tmpfs root), the
//	        pod's shared directory over virtio-9p; waits for the agent over
//	        in-process vsock (agentvm.Wait, as exec and the executors do)
//	    9p: rootfs.share binds the snapshot into the shared directory
//	    ext4, later containers: putTree (guestcopy.go): the root as tar →
//	        agent PutTree into the guest
//	    bindVolumes (volumes.go): directory volumes bound into the shared
//	        directory; copyBinds (guestcopy.go): files → agent PutTree
//	    containerRoot (spec.go): root, mounts, hostname, read-only → the
//	        init's ExecStart.container (the agent creates the container's
//	        namespaces when it starts; execs join them)
//	containerd ── ttrpc Start ──▶ process.run (process.go)
//	    one agent Exec stream: stdin FIFO → stream; stream → stdout/stderr FIFOs
//	    exit status → Wait, State, the TaskExit event (Service.publish)
//	containerd ── Kill/ResizePty/CloseIO ──▶ the process's stream (signal, resize, close_stdin)
//	containerd ── Delete ──▶ unbindVolumes (the 9p root too), the rootfs
//	    unmounted and its ext4 removed; with
//	    the pod's last container the agent powers the guest off and the VM
//	    is closed
//	containerd ── exec "shim delete" (after the daemon died) ──▶ Manager.Stop:
//	    the same clean-up from the bundle, nothing else to stop: the VM died
//	    with the daemon
//
// Goroutines: ttrpc calls each run on their own goroutine; Service.publish
// owns the event publisher; each running VM has its Machine.Run goroutine
// and Service.watchVM, which ends every process when the VM ends; each
// process has three (process.go). Locks: Service.mu (the VM and the
// container table) before process.mu; neither is held across a call into
// the guest, a VM boot or a VM stop.
package containerdshim
