package kvm

import (
	"sync/atomic"
	"unsafe"
)

// setImmediateExit sets or clears kvm_run.immediate_exit. Kick calls it from
// other goroutines while the owner may be entering KVM_RUN, so the byte is
// updated with a compare-and-swap on its aligned 32-bit word (the word's other
// bytes, request_interrupt_window and padding, are never written concurrently).
func (v *VCPU) setImmediateExit(on bool) {
	w := (*uint32)(unsafe.Pointer(unsafe.SliceData(v.run)))
	const shift = runImmediateExit * 8
	for {
		old := atomic.LoadUint32(w)
		nw := old &^ (0xff << shift)
		if on {
			nw |= 1 << shift
		}
		if atomic.CompareAndSwapUint32(w, old, nw) {
			return
		}
	}
}
