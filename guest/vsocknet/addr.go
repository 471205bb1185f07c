package vsocknet

import "fmt"

// Addr is an AF_VSOCK address; it implements net.Addr.
type Addr struct {
	CID  uint32
	Port uint32
}

// Network returns "vsock".
func (a *Addr) Network() string { return "vsock" }

// String returns "vsock(CID:PORT)", or "vsock(any:PORT)" for VMADDR_CID_ANY.
func (a *Addr) String() string {
	if a.CID == CIDAny {
		return fmt.Sprintf("vsock(any:%d)", a.Port)
	}
	return fmt.Sprintf("vsock(%d:%d)", a.CID, a.Port)
}

// CIDAny is VMADDR_CID_ANY: bind to whichever CID this side has.
const CIDAny = 0xffffffff

// CIDHost is VMADDR_CID_HOST, the context ID of the host.
const CIDHost = 2
