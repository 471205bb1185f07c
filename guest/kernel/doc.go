// Package kernel is the guest Linux kernel's build: build.sh compiles
// Debian's linux-source-6.1 from tinyconfig with microvm.config on top into
// build/kernel (vmlinux, bzImage and the resolved config). The package has
// no code; its tests check the built config against what the guest must
// run, such as Docker (docs/docker.md):
//
//	microvm.config -> build.sh -> build/kernel/config -> Docker's check-config.sh
package kernel
