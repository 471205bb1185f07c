package virtio

import "strings"

// Device status bits (virtio 1.2, 2.1).
const (
	StatusAcknowledge = 1
	StatusDriver      = 2
	StatusDriverOK    = 4
	StatusFeaturesOK  = 8
	StatusNeedsReset  = 64
	StatusFailed      = 128
)

// StatusString renders a status byte as its flag names.
func StatusString(s uint32) string {
	if s == 0 {
		return "RESET"
	}
	var names []string
	for _, f := range []struct {
		bit  uint32
		name string
	}{{StatusAcknowledge, "ACKNOWLEDGE"}, {StatusDriver, "DRIVER"}, {StatusFeaturesOK, "FEATURES_OK"},
		{StatusDriverOK, "DRIVER_OK"}, {StatusNeedsReset, "NEEDS_RESET"}, {StatusFailed, "FAILED"}} {
		if s&f.bit != 0 {
			names = append(names, f.name)
		}
	}
	return strings.Join(names, "|")
}

// statusStep is one legal move of the driver-written status bits.
type statusStep struct {
	from, to uint32
	// action is what the transport does on the move.
	action statusAction
}

type statusAction int

const (
	actNone      statusAction = iota
	actNegotiate              // check the driver's features; FEATURES_OK sticks only if acceptable
	actActivate               // validate queues and activate the device
)

// statusTable lists the legal status transitions of the driver
// initialisation sequence (virtio 1.2, 3.1.1). Writing 0 (reset) and
// setting FAILED are legal from any state and handled separately; any other
// move is a driver error that sets DEVICE_NEEDS_RESET.
var statusTable = []statusStep{
	{0, StatusAcknowledge, actNone},
	{StatusAcknowledge, StatusAcknowledge | StatusDriver, actNone},
	{StatusAcknowledge | StatusDriver, StatusAcknowledge | StatusDriver | StatusFeaturesOK, actNegotiate},
	{StatusAcknowledge | StatusDriver | StatusFeaturesOK,
		StatusAcknowledge | StatusDriver | StatusFeaturesOK | StatusDriverOK, actActivate},
}

// lookupStep finds the legal move from -> to.
func lookupStep(from, to uint32) (statusStep, bool) {
	for _, s := range statusTable {
		if s.from == from && s.to == to {
			return s, true
		}
	}
	return statusStep{}, false
}
