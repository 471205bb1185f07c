package microvm

// setupVirtio creates the configured virtio-mmio devices. (Filled in with the
// vsock device.)
func (m *Machine) setupVirtio() error { return nil }

// virtioCmdline returns the virtio_mmio.device= entries for the kernel
// command line.
func (m *Machine) virtioCmdline() []string { return nil }

// startDevices starts device workers before the vCPUs run.
func (m *Machine) startDevices() {}
