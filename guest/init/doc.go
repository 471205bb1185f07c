// Command init is the /init of the Linux test guest: a static Go program
// (CGO_ENABLED=0) that proves our virtio-vsock device against the real
// Linux driver by running named scenarios and printing one result line each
// on the console.
//
// # Life cycle (as PID 1)
//
//  1. Mount /proc, /sys and devtmpfs on /dev; load the kernel modules that
//     /lib/modules/load.order lists, if any ("init: module PATH loaded"),
//     as an image for a distribution kernel has them (mkinitramfs -kmod);
//     print "init: ready".
//
//  2. Ask /dev/vsock for the local CID: "init: vsock cid=N", or
//     "init: vsock unavailable: REASON" (then every vsock scenario fails at
//     once instead of waiting for its timeout).
//
//  3. Run the scenarios listed in microvm.scenarios, in order, each bounded by
//     its timeout, printing
//
//     init: scenario NAME start
//     init: scenario NAME listening port=P        (listening scenarios)
//     init: scenario NAME ok KEY=VALUE ...
//     init: scenario NAME FAIL REASON
//
//  4. Print "init: done ok" or "init: done fail", sync, and end the
//     machine: with ACPI power-off (microvm's tables) reboot(POWER_OFF),
//     and microvm exits; else reboot(LINUX_REBOOT_CMD_RESTART): with
//     reboot=k the kernel resets through the i8042 (microvm exits); without
//     an i8042 (QEMU -M microvm) it falls back to a triple fault, and QEMU
//     -no-reboot exits.
//
// A host should match results with ^init: scenario (\S+) (ok|FAIL)( .*)?$
// and the end with ^init: done (ok|fail)$. Every line is written in a single
// write so that kernel messages cannot split it.
//
// # Parameters
//
// Parameters come from the kernel command line (see Params):
//
//	microvm.scenarios=connect,echo   run connect, then echo
//	microvm.port=1024                KEY for every scenario
//	microvm.echo.port=2000           KEY for echo only (wins over microvm.port)
//
// Common keys: timeout (default 60s; 0 = none), port (1024), cid (2, the
// host), size (K/M/G suffixes), seed (1), dial-retry (0: keep retrying a
// refused dial for that long). Unused microvm.* parameters are reported as
// warnings. Run "init -list" on a host for the scenario table.
//
// # Structure
//
// scenarios.go holds the table (name -> func(ctx, env, params)) and the
// scenarios; runner.go runs them with timeouts and panic recovery;
// params.go parses the command line; vsock_linux.go adapts the AF_VSOCK
// sockets of guest/vsocknet (net.Conn/net.Listener with deadlines
// through the Go poller, shared with the agent); network.go is
// the seam (Network) that tests fill with Unix sockets. Run as an ordinary
// program (PID != 1) it takes the command line from -cmdline and neither
// mounts nor reboots.
package main
