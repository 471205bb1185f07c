//go:build !cgo

package seccomp

// cgoRules are empty in a static build: the Go runtime makes every thread
// itself (see cgo_on.go for what glibc needs).
func cgoRules() []rule { return nil }

// cgoThreadFlags are empty: no glibc threads.
var cgoThreadFlags []uint32
