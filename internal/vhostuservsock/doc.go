// Package vhostuservsock is `microvm vhost-user-vsock`: microvm's vsock
// device served to another VMM (QEMU) over vhost-user, a drop-in for
// rust-vmm's vhost-device-vsock. The CLI reads its flags into a Config and
// makes one call, Serve, passing its process set-up (CPU profile, signals,
// chroot, seccomp filter) as Options hooks.
//
// Data flow of Serve: vsock.New makes the device from Config.Device (any
// ring size; guest connections dialled at UDS_P) -> vsock.ListenUDS
// listens for host clients' "CONNECT <port>" on Config.UDS ->
// vhostuser.Listen listens on Config.Socket -> metricsrv.Start serves
// metrics (the device's and the back-end's counters, as
// microvm.VhostUserVsockMetrics) on Config.MetricsSocket -> the hooks:
// StartCPUProfile, Interruptible, Confine -> the host socket's accept loop
// and the back-end's serve loop start, and the "listening" line goes out
// -> a front-end's vhost-user messages set the device's memory table and
// rings (virtio/vhostuser); its kicks reach the device's workers, which
// talk to the host sockets and signal the front-end's call eventfds ->
// ctx's end (a signal) or the back-end's failure closes the back-end (the
// front-end is disconnected and the device reset), then the metrics
// server, the host socket and the device, in that order.
//
// Goroutines: Serve's caller waits in Serve; it starts the host socket's
// accept loop (vsock.UDS.Serve, stopped by its Close) and the back-end's
// serve loop (vhostuser.Backend.Serve, stopped by its Close, waited for at
// most 5 seconds once ctx ends).
package vhostuservsock
