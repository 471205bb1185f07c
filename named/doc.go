// Package named is the Go API of named VMs: those `microvm run --name
// NAME` started, reached through their control API (internal/vmctl,
// docs/api.yaml) and their state directory (internal/vms), as the CLI's
// ls, pause, resume, stop and kill reach them. It is a feature package of
// the embedding API: a program that controls no named VMs does not import
// it; the root package does not import it, and the lean CLI (bin/microvm),
// which neither lists nor controls named VMs itself, links none of it.
//
// Data flow: StateDir -> List (every record and lock under it) or Lookup
// (one record, and a running VM's live state from its control API) -> a
// VM -> its methods (Pause, Resume, Stop, Snapshot, WriteMetrics) send a
// request over the VM's API socket to the VM's own process; DialVsock
// connects through its vsock socket to a guest port. Logs reads the VM's
// console log from its directory and, following, polls the file and the
// VM's lock until the VM ends.
package named
