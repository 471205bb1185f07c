package vsock

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// MaxConnectLine is the longest CONNECT line accepted, newline included.
const MaxConnectLine = 64

// ErrConnectLine is returned (wrapped) for a malformed or overlong CONNECT
// line; the host connection is then closed.
var ErrConnectLine = errors.New("bad CONNECT line")

// ConnectParser reads the Firecracker host handshake "CONNECT <port>\n"
// incrementally: bytes may arrive split across any number of reads. The
// keyword is case-insensitive and words may be separated by any blanks (as
// Firecracker accepts); the port is decimal; anything else on the line is an
// error. Bytes after the newline are payload for the
// guest and are handed back, never swallowed.
type ConnectParser struct {
	line []byte
}

// Feed adds b. It returns done=true with the port and the payload bytes that
// followed the newline once a full line has arrived; an error once the line
// is known to be bad (too long, or not CONNECT <port>).
func (p *ConnectParser) Feed(b []byte) (port uint32, rest []byte, done bool, err error) {
	for i, c := range b {
		if c == '\n' {
			p.line = append(p.line, b[:i]...)
			port, err := parseConnect(p.line)
			if err != nil {
				return 0, nil, false, err
			}
			return port, b[i+1:], true, nil
		}
		if len(p.line)+i+1 >= MaxConnectLine {
			return 0, nil, false, fmt.Errorf("%w: longer than %d bytes without a newline", ErrConnectLine, MaxConnectLine-1)
		}
	}
	p.line = append(p.line, b...)
	return 0, nil, false, nil
}

func parseConnect(line []byte) (uint32, error) {
	s := string(line)
	// Words are separated by any run of blanks, as Firecracker's parser
	// (split_whitespace) does, so clients written against it work here.
	f := strings.Fields(s)
	if len(f) != 2 || !strings.EqualFold(f[0], "CONNECT") {
		return 0, fmt.Errorf("%w: %q: want \"CONNECT <port>\"", ErrConnectLine, strings.TrimSuffix(s, "\r"))
	}
	arg := f[1]
	if arg[0] < '0' || arg[0] > '9' {
		return 0, fmt.Errorf("%w: %q: bad port", ErrConnectLine, strings.TrimSuffix(s, "\r"))
	}
	v, err := strconv.ParseUint(arg, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("%w: %q: bad port", ErrConnectLine, strings.TrimSuffix(s, "\r"))
	}
	return uint32(v), nil
}
