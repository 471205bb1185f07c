//go:build !amd64

package seccomp

import (
	"fmt"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// OCIFilter is a compiled OCI profile (oci_amd64.go).
type OCIFilter struct {
	Program []byte
	Flags   uint32
	Unknown []string
}

// CompileOCI is built for x86-64 only.
func CompileOCI(p *specs.LinuxSeccomp) (*OCIFilter, error) {
	if p == nil || (p.DefaultAction == "" && len(p.Syscalls) == 0) {
		return nil, nil
	}
	return nil, fmt.Errorf("%w: OCI seccomp profiles are compiled for x86-64 only", ErrUnsupported)
}
