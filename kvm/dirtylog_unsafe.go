package kvm

import (
	"runtime"
	"unsafe"
)

// getDirtyLog issues KVM_GET_DIRTY_LOG for slot, which fills bitmap. struct
// kvm_dirty_log carries the bitmap's address as an integer, which the garbage
// collector does not see: bitmap is kept alive until the call returns, and
// must be heap-allocated (Go's heap does not move objects; a goroutine stack
// can). The caller sizes it for the slot: KVM writes a bit per page of it.
func (vm *VM) getDirtyLog(slot uint32, bitmap []uint64) error {
	d := dirtyLog{Slot: slot, Bitmap: uint64(uintptr(unsafe.Pointer(unsafe.SliceData(bitmap))))}
	_, err := ioctlPtr(vm.fd(), kvmGetDirtyLog, &d)
	runtime.KeepAlive(bitmap)
	return err
}
