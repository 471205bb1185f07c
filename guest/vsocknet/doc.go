// Package vsocknet wraps AF_VSOCK stream sockets (virtio-vsock in a guest)
// as net.Listener and net.Conn, for the programs that run inside a guest:
// the test /init (guest/init), the agent (guest/agent) and users' own
// guest services (examples/rpcservice).
//
// # Data path
//
// Sockets are created non-blocking (SOCK_NONBLOCK) and wrapped in *os.File,
// which registers them with the Go runtime's poller: Listener.Accept,
// Conn.Read, Conn.Write and Dial's wait for the handshake park the calling
// goroutine on epoll instead of blocking a thread, deadlines work, and Close
// from another goroutine wakes a blocked call with net.ErrClosed. Errors are
// *net.OpError with Net "vsock" (io.EOF stays bare), so errors.Is reaches the
// errno underneath.
//
// # Goroutines and locks
//
// The package starts no goroutines and holds no locks: a Listener may be
// used from several goroutines (the poller serializes Accept), a Conn's Read
// and Write may run concurrently, as with net.TCPConn.
package vsocknet
