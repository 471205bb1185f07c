//go:build !amd64

package seccomp

import "fmt"

// microvm is an x86-64 VMM: elsewhere there is no allow-list, and Install
// reports ErrUnsupported.
const auditArch = 0

var syscallNames [0]string

// VMM has no rules off x86-64; Install refuses it.
func VMM() Policy { return Policy{name: "microvm"} }

// VMMUserNet has no rules off x86-64; Install refuses it.
func VMMUserNet() Policy { return Policy{name: "microvm --net user"} }

// UserNet has no rules off x86-64; Install refuses it.
func UserNet() Policy { return Policy{name: "microvm-net"} }

// VhostUserVsock has no rules off x86-64; Install refuses it.
func VhostUserVsock() Policy { return Policy{name: "microvm vhost-user-vsock"} }

func installHandler(Options) error { return fmt.Errorf("%w: no SIGSYS handler", ErrUnsupported) }

// WithShares has no rules off x86-64; Install refuses the policy anyway.
func (p Policy) WithShares() Policy { return p }

// WithCacheCommits has no rules off x86-64; Install refuses the policy anyway.
func (p Policy) WithCacheCommits() Policy { return p }
