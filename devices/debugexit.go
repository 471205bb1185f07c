package devices

// DebugExitPort is the port of the debug-exit device, the same as QEMU's
// isa-debug-exit default.
const DebugExitPort = 0xf4

// DebugExit lets the guest end the VM with a status of its choice: a byte b
// written to the port makes microvm exit with status b. (QEMU's isa-debug-exit
// exits with (b<<1)|1 for the same write.)
type DebugExit struct {
	// Exit is called with the status. It must not block.
	Exit func(status int)
}

// Read returns 0.
func (d *DebugExit) Read(_ uint64, data []byte) { clear(data) }

// Write ends the VM with the low byte written.
func (d *DebugExit) Write(_ uint64, data []byte) {
	if len(data) > 0 && d.Exit != nil {
		d.Exit(int(data[0]))
	}
}
