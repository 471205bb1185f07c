// Package clibase is what the two microvm binaries share: the lean
// cmd/microvm (bin/microvm: `run` and `version`, the standard flag
// package) and cmd/microvm-full (every command, urfave/cli). It holds
// `run`'s flags, declared once as Opts for both parsers (flags.go; the
// standard flag package's reading, leanflags.go), the device, vsock, log,
// privilege and seccomp flag groups other commands reuse, the run of a VM
// without a name, and what every command's process does: logs, chroot,
// privilege drop and the seccomp filter, signals, exit status. It imports
// neither urfave/cli nor what only microvm-full's commands use (gRPC, the
// image code, named VMs), so the lean binary links none of it
// (cmd/microvm/deps_test.go).
//
// Data flow of `microvm run` without a name (RunPlain): a parsed command
// line (FlagValues: urfave/cli's Context or LeanFlags) -> SetupLog ->
// RunConfig reads the flags into a microvm.Config (ReadDeviceFlags,
// ReadVsockLimits, ParseVsockOpt) -> the binary's Plain.Elsewhere may hand
// the run to microvm-full -> ReadPrivilegeFlags, ReadChroot -> RunMachine:
// microvm.New, then Interruptible's context, Confine (EnterChroot,
// DropPrivileges, the seccomp filter of VMMPolicy) and Machine.Run -> the
// guest's end as an error that ExitStatus turns into the exit status
// (StatusError, UsageError, Failure).
package clibase
