// Package hybrid is a host-side client for the hybrid-vsock Unix
// socket that microvm (--vsock-uds), Firecracker (uds_path) and Cloud
// Hypervisor (--vsock socket=) expose for a guest's virtio-vsock device.
//
// # The handshake
//
// A host process reaches guest port P by connecting to the VMM's Unix
// socket and sending one line, "CONNECT P\n". The VMM forwards the request
// to the guest (a vsock REQUEST packet, virtio 1.2 section 5.10.6.3); when
// the guest accepts it, the VMM answers "OK <host port>\n", where the host
// port is the local port it allocated for the connection (Firecracker and
// microvm pick it from [2^30, 2^31)). From then on the socket is a plain
// byte stream to the guest's socket, with half-close passed through both
// ways. If the guest refuses or does not answer within the VMM's own
// timeout, or the line is malformed, the VMM closes the socket without a
// word.
//
// # A Dial's path
//
// Dial connects (net.Dialer.DialContext), writes "CONNECT P\n" in one
// write, and reads the answer one byte at a time up to the newline, so no
// byte the guest sends right after the OK line is taken out of the socket:
// the returned Conn is the socket itself (Conn.UnixConn) with the host port
// attached, and its first Read returns the guest's first bytes. The answer
// must be "OK", one space and a decimal 32-bit port; a '\r' before the
// newline is tolerated (no VMM sends one, but a line-oriented proxy might
// add it). At most MaxOKLine bytes are read looking for the newline, so a
// peer that is not a VMM cannot make the client buffer without bound.
//
// The context bounds the whole handshake: its deadline becomes the
// socket's deadline while Dial runs, and cancelling it sets a deadline in
// the past so a blocked read or write returns at once. The returned Conn
// has no deadline.
//
// AwaitOK is the same handshake without the CONNECT line, for a socket
// whose request reached the VMM another way: microvm's in-process
// Machine.DialVsock hands one end of a socketpair straight to the device
// and waits for the OK line on the other with AwaitOK.
//
// # A Pipe's path
//
// Pipe is `microvm vsock-connect` as a call: Dial under ctx, then a
// goroutine copies in to the socket and half-closes it (CloseWrite) at
// in's end, while Pipe copies the socket to out until the guest's end of
// the stream; ctx no longer matters once the handshake is done. Pipe
// returns at the guest's end without waiting for in (a terminal may never
// end): the goroutine ends at its next read of in, on the closed socket.
//
// # Errors
//
// Every error names the socket and the port and wraps the cause:
//
//   - ErrRefused: the VMM closed the socket (or reset it) before an OK line:
//     nothing listens on the guest port, the guest refused, or it did not
//     answer within the VMM's connect timeout. The read error (io.EOF,
//     ECONNRESET, EPIPE) is wrapped too.
//   - ErrTimeout: the context's deadline passed before the OK line; the
//     error also satisfies errors.Is(err, context.DeadlineExceeded).
//   - ErrNotVsock: the peer answered something other than an OK line (or
//     an overlong one, or closed it half-way), or the path is not a stream
//     socket at all.
//   - a cancelled context gives an error wrapping context.Canceled.
//   - failures to connect are *net.OpError values, wrapped: a missing socket
//     file satisfies errors.Is(err, fs.ErrNotExist); a socket file nobody
//     listens on (the VMM has exited) wraps syscall.ECONNREFUSED.
//
// Dial and AwaitOK start no goroutine; the cancellation hook
// (context.AfterFunc) is removed before they return. Pipe starts the one
// that copies in, described above.
package hybrid
