// Package vsock is microvm's virtio-vsock device (virtio 1.2, 5.10): stream
// sockets, SEQPACKET sockets and (experimental, off by default) datagrams
// between the guest and host Unix sockets, with the Firecracker host
// protocol ("CONNECT <port>\n" -> "OK <host port>\n" on the listening
// socket; guest connections to port P go to "<uds>_P").
//
// The device runs unchanged under two hosts: microvm's own virtio-mmio
// transport (KVM: kicks arrive through ioeventfds, interrupts leave through
// an irqfd) and the vhost-user backend (kicks and interrupts are the
// frontend's eventfds). It only sees virtio.Activation: guest memory, the rx
// and tx queues, the event queue (when the driver set it up), the datagram
// queues when negotiated, and a Fail callback. Under vhost-user the
// front-end keeps the event queue; BackendQueues says which rings it hands
// over.
//
// # Where things are
//
//   - connsm.go: one connection's protocol state machine (connSM): its
//     state, the shutdown flags of either side, the control packets owed
//     to the guest. Pure: events in (a guest packet's op, the dial's
//     outcome, the host's EOF or hang-up, a timeout, a SHUTDOWN sent),
//     actions out (act bits: count, write "OK", half-close or close the
//     host socket, start the close timer, send RST). Tested alone, without
//     goroutines or sockets (connsm_test.go: every transition, and random
//     and fuzzed walks against its invariants).
//   - mux.go: the seam between a connection and the muxer: the narrow
//     interface (mux) through which a connection reaches what all
//     connections share (the table, the epoll set, the RST queue), and
//     connEnv, the settings and counters they share.
//   - conn.go: a connection's data: credit counters, the bytes waiting for
//     the host, SEQPACKET messages and records. A connection owns them, its
//     host socket and its timer, and is the only one to act on its state
//     machine's decisions:
//   - connfx.go: the connection carrying out those decisions (applyLocked:
//     counters, timers, "OK", half-closes, close, RST), registering its
//     socket, taking in its readiness, letting go of it all when closed.
//   - connwrite.go: the connection writing the guest's bytes to its host
//     socket (straight from guest memory, or via its byte queue).
//   - connread.go: the connection reading its host socket into the guest
//     buffers the RX side hands it.
//   - budget.go: the device-wide buffer bound, and each connection sizing
//     its own window from it; interest.go: what each host socket's epoll
//     registration asks for.
//   - session.go: the muxer: the connection table, the descriptor index
//     and epoll set, the RST queue and the ready list; it implements mux.
//   - tx.go, rx.go: the workers (below), which route: packets from the
//     guest to their connection, host readiness and data and control
//     packets to the guest. They ask the state machine at each event and
//     have the connection act; they never set a connection's state
//     themselves.
//   - rxspare.go: RX buffers a host read popped and left empty, oldest
//     first.
//   - txirq.go: the RX interrupt the TX worker holds to the end of a batch.
//   - event.go: the event queue; dgram.go: datagrams; uds.go: the host's
//     Unix sockets (one back-end, below).
//   - quiesce.go: stopping a session for a pause or a snapshot
//     (virtio.Quiescer) without leaving a chain popped; state.go: the
//     saved state (virtio.StatefulDevice).
//   - inspect.go: each connection's state and counters for an operator
//     (Device.Connections; microvm logs them on SIGUSR1).
//
// One guest packet, for example RW: txLoop pops the chain (tx.go) ->
// handlePacket decodes and checks the header, finds the connection in the
// muxer's table (session.go) -> connSM.onGuestOp says whether the payload
// is admitted (connsm.go) and the connection carries out the rest
// (connfx.go) -> conn.guestData checks the credit (conn.go's counters) and
// writes the payload to its host socket, or buffers it (connwrite.go) ->
// endRun decides on a CREDIT_UPDATE and hands RX work to rx.go.
//
// # The back-end seam
//
// The device does not know what is on the host side of a connection: only
// a connected socket descriptor. Two calls make the seam. Host-initiated:
// the back-end hands the device a socket with Device.ConnectFromHost (or
// ConnectSeqpacketFromHost). Guest-initiated: the device asks
// Config.Dialer (and SeqpacketDialer) for one. Two back-ends exist: the
// Firecracker-compatible Unix sockets (uds.go: UDS for the host's
// connections, UDSDialer for "<uds>_P") and the in-process one of the
// root package (Machine.DialVsock hands over one end of a socketpair;
// ListenVsock's router is the Dialer, falling back to UDSDialer).
//
// # Goroutines and what they own
//
//   - TX worker (tx.go, one per activation): owns the TX queue. Woken by the
//     TX kick eventfd, it pops chains, decodes each header once from a copy,
//     and acts on it: REQUEST starts a dial goroutine, RESPONSE completes a
//     host-initiated connection (writing "OK <port>\n"), RW payloads go to
//     the host socket straight from guest memory with writev (one writev
//     per run of packets for a connection), SHUTDOWN/RST close. It returns
//     the chains and interrupts once per batch. A pass handles at most
//     txPassBudget chains (256): a guest that keeps the ring full gets its
//     next pass only after the worker has looked at its stop and resume
//     eventfds (without waiting), so Stop, which the transport calls under
//     its lock, never waits on the guest. While a transport reset
//     waits for the guest it holds REQUESTs, and resumeTX wakes it after;
//     stopping, it puts the chains it holds back in the ring (quiesce.go).
//   - RX worker (rx.go, one per activation): owns the epoll set (host
//     sockets, the RX and event queues' kick eventfds, a wake eventfd, a
//     stop eventfd). It writes a pending TRANSPORT_RESET into the event
//     queue (event.go), then fills guest RX buffers: queued RSTs first,
//     then each connection on the ready list (control packets, then host
//     data read with one readv
//     straight into up to 16 guest buffers, then credit updates and
//     shutdowns). One interrupt per pass. Producers on other goroutines
//     (the TX worker, dial goroutines, ConnectFromHost on a handshake
//     goroutine) may also place a control packet in the RX ring themselves
//     under rxMu (DirectEnqueue).
//   - dial goroutines (one per guest-initiated connection attempt): call
//     the Dialer with the guest's and the host's port (UDSDialer connects to
//     "<uds>_P") with a timeout, so a slow listener never blocks a worker.
//   - UDS accept goroutine (UDS.Serve, started by the embedder and stopped
//     by UDS.Close) and handshake goroutines (uds.go, at most MaxConns at
//     once, waited for by UDS.Close): parse the CONNECT line under a
//     deadline and hand the socket to the device.
//   - timers (time.AfterFunc, stopped when the connection closes): the
//     connect timeout of a connection attempt, and the close timeout of a
//     connection the device sent SHUTDOWN(both) to.
//   - datagram worker (dgram.go, one per activation, only when the driver
//     negotiated FeatureDgram): owns both datagram queues and, for the
//     session, the device's host datagram socket (see Datagrams below).
//
// session.shutdown (Stop: Reset, Close; Drain: Quiesce) signals the
// workers' stop eventfds and waits for them, then closes every connection;
// dial goroutines and timers that fire later find their connection closed
// and only close what they hold. Drain then puts back the RX buffers the
// session popped and left empty (# Quiesce below).
//
// # Locks
//
// The device's virtio.Lifecycle (Device.life) guards the active session
// (beside it, Device.resetOwed, the event a quiesce or restore leaves owed
// to the next session, is an atomic); its lock is never held while a session
// lock is taken, nor while the session stops (the MMIO transport calls
// Activate and Reset with its mu held: MMIO.mu -> Lifecycle.mu). In a
// session: connMu guards the connection table; conn.mu guards one connection
// (its state, credit counters, SEQPACKET messages and records, buffered data
// and host descriptor); rxMu guards the RX queue, the ready list, the RST
// queue and the event queue. Lock order: conn.mu -> connMu and conn.mu ->
// rxMu. connMu and rxMu are leaves, never held together (ResetTransport, on
// the embedder's goroutine, takes each conn.mu in turn, then rxMu, then
// connMu, one at a time) (budget.mu, the starved list's lock, is a leaf
// below conn.mu and rxMu): code that finds a connection under connMu
// (lookup, hostEvent, shutdown) or pops it from the ready list under rxMu
// releases that lock before taking conn.mu. Nobody holds two conn.mu at once
// (the TX worker ends its run before touching another connection). rxMu
// holders may call Activation.Fail and the queue's Interrupt, which take
// only the transport's signalling lock (virtio's MMIO.irqMu, or a vhost-user
// ring's sigMu).
//
// A goroutine that hands a connection to the RX worker (the ready list)
// wakes the worker only after unlocking that connection (emitOrQueueLocked
// reports the wake-up due): the worker's first step is to lock it. Every
// other wake-up decided under a connection's lock goes out after it too,
// through conn.unlock (conn.wakeRX: budget given back, an RST its state
// machine queued, RX buffers put on the spare list); callers that hold no
// connection lock wake at once (sendRst). The one wake-up under a lock is a
// transport reset's, under connMu only (event.go). rxMu is
// never held across a data-moving call: the RX side pops the guest buffers
// a host read may fill under it, the connection reads into them without it
// (connread.go) and the RX side pushes them under it again, the empty ones
// going to a spare list every pop takes from first (rxspare.go). Whoever
// puts buffers there while other RX work waits wakes the RX worker after
// unlocking (rxMu, and the connection's lock): it may have found none while they were out and gone to sleep
// for a guest kick that will not come (TestRxSpareWakesRX). Still held
// across one: the connection's own lock, over its readv and over its writev
// to the host socket; it is the connection's owner's lock, which keeps
// that connection's bytes in order, and no other connection waits on it.
//
// # A packet's path
//
// Guest to host: driver writes the packet into the TX ring and kicks ->
// ioeventfd -> TX worker pops up to 64 chains, copies each 44-byte header
// out once, checks CIDs, type, length against the chain and the
// connection's credit -> the payload views of a run of packets for one
// connection go to its host socket in one writev at the end of the run
// (before the used index is published, so the guest cannot reuse the
// buffers first); what the socket does not take is copied into the
// connection's buffer (bounded by the credit we advertised) and flushed on
// EPOLLOUT by the RX worker -> used entries published, fwd_cnt advanced,
// CREDIT_UPDATE when the guest's view of our free space falls below half.
// A connection the guest leaves half-open after the device's full SHUTDOWN
// is reset after the connect timeout.
//
// Host to guest: host socket readable (edge-triggered EPOLLIN) -> the RX
// worker puts the connection on the ready list -> when the guest has RX
// buffers and credit, one readv from the socket into up to 16 buffers at
// once (after each one's header space, no more than the credit) -> a header
// written into each filled buffer, used entries pushed, unused buffers kept
// on the spare list for the next packet -> one interrupt per pass.
// A connection without credit leaves the list until a guest packet brings
// credit; with no RX buffers the worker re-enables RX kicks and sleeps.
//
// # Half-close (SHUTDOWN, 5.10.6.6)
//
// Guest SHUTDOWN(SEND) ("will not send"): once the host socket has taken
// everything the guest sent before it, the device calls shutdown(SHUT_WR)
// on it, so the host reads EOF and may go on writing.
//
// Guest SHUTDOWN(RCV) ("will not receive"): the device calls
// shutdown(SHUT_RD) on the host socket at once. On a Unix stream or
// SEQPACKET socket that also shuts the peer's sending side, so the host's
// next write fails with EPIPE (SIGPIPE without MSG_NOSIGNAL), exactly what
// a Linux vsock application sees when its peer shuts down receiving
// (vsock_connectible_sendmsg checks the peer's RCV_SHUTDOWN). Host data the
// guest has not been given yet is dropped, never delivered, even if the
// guest later grants credit: the CONNECT prefix, a SEQPACKET record in
// flight, and whatever waits unread in the socket (the kernel frees it with
// the socket). No RST is sent: the guest can still send, and the host still
// reads. Since the device never reads the socket again, the host's close is
// learnt from EPOLLHUP alone, and the guest is then told SHUTDOWN(BOTH).
//
// Both flags (at once or one after the other): the device forwards what the
// guest sent, then answers RST and closes the host socket.
//
// # Transport reset (the event queue, 5.10.6.7)
//
// Device.ResetTransport is the host side of the transport restarting under a
// live guest driver (microvm: Machine.ResetVsockTransport; the first session
// after a quiesce or a restore starts with the same event and fence, with no
// connection left to drop: # Quiesce below). It raises a fence
// (session.fence, under connMu: no connection may be added), drops every
// connection, closing the host sockets, queues an RST for each (for guest
// sockets the event does not reach: Linux resets only connected ones, and
// may read a RESPONSE after the event), and marks a
// VIRTIO_VSOCK_EVENT_TRANSPORT_RESET pending. The RX worker writes it (le32
// id 0, used length 4, which is what a Linux driver checks) into the next
// event buffer, noting the driver's available index first and asking for a
// kick past it, and interrupts the guest, which resets every connected
// socket (ECONNRESET), re-reads the CID and posts the buffer again. That
// repost lifts the fence (checkFence; or the connect timeout, which also
// drops an event still undelivered); the TX worker holds REQUESTs (and the
// packets behind them) while the fence is up and resumes on resumeTX, and
// host connects wait for it. So no connection is set up that the guest's
// handling of the event would reset behind the device's back. The queues
// keep running. Without an event queue (vhost-user: QEMU keeps it and sends
// the event itself after a migration) the RSTs are all the guest gets, and
// there is no fence. A device reset (the driver writing status 0) needs none
// of it: the driver's queues and sockets go with it. An event buffer too
// small for the event stops the device like a broken RX buffer.
//
// # Quiesce and snapshots (quiesce.go, state.go)
//
// Device.Quiesce (virtio.Quiescer; MMIO.Quiesce calls it with the vCPUs
// stopped) stops the session for a pause without leaving a chain popped:
// when it returns no goroutine of the device touches a queue or guest
// memory, and each queue's next available entry is its published used
// index, so the transport can save the positions and the next activation
// (MMIO.Resume, or MMIO.RestoreState in a new process) continue there.
// Connections do not survive it (as in Firecracker): their host sockets
// are closed as a device reset closes them, with no RST to the guest, and
// the session's budget goes back to zero. The next session tells the
// guest with a TRANSPORT_RESET before anything else, under the fence
// ResetTransport raises (event.go), so nothing connects before the guest
// has reset its old sockets and re-read the CID (a restored clone may have
// another). Who returns what (Drain, after the workers have stopped, each
// between passes):
//
//   - the TX worker: everything it popped is handled and pushed, but the
//     chains a fence holds behind a REQUEST, which it puts back with Undo
//     (newest first) as it stops; the next session handles them, so a
//     guest connection attempt the device had not taken survives.
//   - RX: every buffer popped and not pushed is on the spare list once the
//     workers have stopped and every connection is closed under its lock
//     (so no dial goroutine or host connect can emit). Pops take the
//     oldest spare buffer first, so the list is the ring's most recent
//     pops, put back with Undo, newest first; one that a producer's pop
//     and push made older than a returned buffer (while another's read was
//     out) cannot be, and is returned empty (used length 0, which Linux
//     drops and replaces). Control packets, SEQPACKET records and events
//     are popped and pushed in one go under rxMu: rxChain and evChain never
//     stay popped.
//   - the datagram worker returns every chain it pops before it looks at
//     the stop signal.
//
// Device.resetOwed carries the event from the drained session to the next
// one (a device reset drops it). Host connects waiting on a drained
// session keep their socket and wait for the next one within their
// deadline (errQuiesced), as connects that come during the pause do. A
// guest connection being dialled is dropped with the rest without an RST:
// the guest's socket, not yet connected, is not reset by the event and
// fails on its own connect timeout. A driver without an event queue is not
// told at all.
//
// Saved state (state.go, virtio.StatefulDevice): {"TransportReset": bool},
// whether the saved device owed the event. Neither connections nor the
// CID (Config) are saved. RestoreDeviceState checks it strictly
// (virtio.ErrBadState) and arms the event for the first session whatever
// it says: a restored device has none of the saved one's connections.
//
// # Optimisations (Options, each measurable on and off)
//
// KickSuppress (guest kicks stay off across the host write, with a final
// ring re-check), DirectEnqueue (a producer places a control packet into the
// RX ring itself when nothing is queued ahead, and the TX worker, when a
// guest packet brings the credit that unblocks host data, reads that data
// into the RX ring itself instead of waking the RX worker), BatchLock (one lock and one
// credit decision per run of packets for a connection, readiness made
// visible after unlocking), ShortReadDrains (a host read that returned less
// than it asked for counts as drained, so the socket is not read again just
// to see EAGAIN; not after a hang-up, which no later edge repeats),
// SendBuffer (each host stream socket's SO_SNDBUF sized from the
// connection's window, so guest data the socket takes at once need not
// wait in the byte queue), ReadinessGate (epoll asks only for the
// host-socket events the device can act on: no EPOLLIN while host data waits
// without credit, EPOLLOUT only while bytes wait in the byte queue;
// interest.go), IRQCoalesce (on a shared virtio-mmio line the RX
// interrupt of the TX worker's direct enqueues waits for the end of its
// batch and goes out with the TX completions as one; txirq.go). Each
// moves a counter of its own in Stats (DirectEnqueues, KickSuppressions,
// BatchedPackets, InterestChanges; HostReadsEmpty, the other way round:
// only when off, on every drained socket) as TestOptions checks; the CLI sets them with --vsock-opt, and make
// bench-device measures them. RxHandoffs counts the work producers still
// hand to the RX worker with a wake-up (always, without DirectEnqueue);
// host data the RX worker learns of by its own epoll is none, so a
// ping-pong makes no hand-off either way (TestPingPongNoHandoff). Seed 004's copybreak (copy small payloads
// rather than scatter-gather) was built, measured and removed: it never won
// here (docs/notes/performance.md).
//
// Guest data the host socket does not take at once waits in the
// connection's byteQueue (bounded by the advertised buffer): chunks from
// pools shared by all connections, given back as they drain, flushed with
// one writev, so partial writes cost linear time, queued bytes never
// move, and an idle connection holds no buffer.
//
// # SEQPACKET (VIRTIO_VSOCK_F_SEQPACKET, 5.10.6.3.2)
//
// Offered always; only a driver that negotiated it may send packets of
// TypeSeqpacket (others are refused with RST and counted, as before). A
// connection keeps its type: a packet of the other type resets it, and
// every packet the device sends for it (RST included: Linux drops an RST of
// another type) carries it. The host side is SOCK_SEQPACKET Unix sockets,
// where one record is one message:
//
//   - guest-initiated: a SEQPACKET REQUEST to port P is dialled with a
//     SeqpacketDialer (UDSDialer: "<uds>_P" with SOCK_SEQPACKET; a stream
//     listener refuses with EPROTOTYPE, a refusal like any other: RST);
//     a Dialer without DialSeqpacket refuses them.
//   - host-initiated: UDS also listens with SOCK_SEQPACKET at
//     "<uds>.seqpacket"; there the CONNECT line and the OK reply are one
//     record each (ConnectSeqpacketFromHost), and the REQUEST is of type
//     SEQPACKET, so only a guest socket listening with SOCK_SEQPACKET
//     accepts it. The stream socket stays stream-only.
//   - guest to host: RW fragments gather in conn.msg until the one with
//     SeqEOM; the message then goes out as one sendmsg (MSG_EOR if the
//     guest set SeqEOR): straight from guest memory when nothing is queued
//     ahead, otherwise copied behind the queued records (conn.toHost holds
//     their bytes, conn.recs their lengths). A record never merges with
//     another and never goes out in part (Unix SEQPACKET sends are all or
//     nothing), whatever the Options: with BatchLock each record is still
//     its own sendmsg. Unforwarded fragments count against the credit, so
//     a message larger than the buffer we advertise overruns it: the
//     connection is reset and the error counted, and memory stays bounded
//     (the buffer, plus 4 bytes per queued record). An empty message, and
//     an unfinished one at the guest's SHUTDOWN(SEND), are dropped.
//   - host to guest: the RX worker peeks the next record's length
//     (MSG_PEEK|MSG_TRUNC) and reads it (into conn.rec) only once the
//     guest's credit covers all of it, so no record is cut by a credit
//     stall; then it fills as many RX buffers as the record needs, one RW
//     packet each, SeqEOM|SeqEOR on the last; out of buffers it resumes the
//     same record on the next turn. A record larger than the guest's whole
//     buffer can never be delivered (Linux hands a message over only once
//     all of it is buffered): the connection is reset. Unix sockets never
//     report MSG_EOR, but each record is a whole record, so every message
//     carries SeqEOR. Empty records are dropped (no packet can carry one);
//     a read of 0 bytes is taken for the end of the stream only when the
//     peer has shut down writing and nothing is queued.
//
// # Datagrams (experimental, Config.Dgram)
//
// FeatureDgram, microvm's own datagram feature (bit 23, not the RFC
// series' VIRTIO_VSOCK_F_DGRAM, bit 3, whose datagrams share the stream
// queues: dgram.go says why), is offered only with
// Config.Dgram, which adds queues 3 (datagram RX) and 4 (datagram TX) after
// the event queue; the default device keeps three queues and offers only
// SEQPACKET. A packet of type TypeDgram, op RW, is one datagram: no connection
// table entry, no credit. Host side, every datagram carries an 8-byte
// prefix (guest port, host port; u32 little endian).
//
// Who owns what: the Device owns the host datagram socket "<uds>.dgram"
// from New to Close (bound across activations); while a session runs, its
// datagram worker is the only user of that descriptor and of both datagram
// queues. No lock is involved: the worker shares nothing with the stream
// workers but the counters (atomics) and failDevice.
//
// Guest to host: the driver writes a datagram into queue 4 and kicks ->
// datagram worker (woken by the kick eventfd, kicks off while it drains with KickSuppress,
// re-enabled with a final ring re-check) pops the chain, copies the header
// out once, checks CIDs, type, op, ports (not VMADDR_PORT_ANY) and the
// length against the chain and MaxDgramPayload (else: GuestErrors, chain
// returned) -> one sendmsg (MSG_DONTWAIT) of [prefix, payload views of guest
// memory] from "<uds>.dgram" to "<uds>_<port>.dgram"; an error (no socket,
// full queue) drops it (DgramTxDropped) -> chains returned, one interrupt
// per batch of up to 64. A pass handles at most dgramPassBudget (256)
// datagrams; then the worker serves the host side and looks at its stop
// eventfd before the next, so a guest flooding queue 4 starves neither.
//
// Host to guest: "<uds>.dgram" readable (poll) -> the worker pops a buffer
// from queue 3 and receives the datagram with one recvmsg straight into it:
// the prefix into a scratch array, the payload after the header space ->
// header written (ports from the prefix), used entry pushed; a datagram
// shorter than the prefix or truncated (MSG_TRUNC: larger than the buffer)
// is rejected and the buffer given back (DgramRxRejected). No buffer posted:
// the datagram is read into the worker's scratch and dropped
// (DgramRxDropped), so a guest that does not read neither backs up the host
// socket nor makes the device hold memory. At most 64 delivered (256 seen)
// per pass, then publish and one interrupt. The guest's RX kicks are never
// needed and stay off.
//
// # The device-wide buffer bound (Config.MaxBuffered, budget.go)
//
// Each connection may make the device buffer at most its exposure,
// bufAlloc - (fwdCnt - grantFwd): the window it was granted, less what the
// host took since the fwd_cnt it may be told. The session's budget holds
// the sum, and never lets it pass MaxBuffered (64 MiB by default; 1023
// connections of 1 GiB would otherwise be a terabyte). Credit is only ever
// granted, never withdrawn: the buf_alloc a connection is told only grows
// (from 0, up to ConnBuffer) and its fwd_cnt only moves forward. So what an
// idle connection holds stays held, and the budget has two parts:
//
//   - a reserve of MaxConns x 4 KiB (the minimum window; ConnBuffer if
//     smaller): every connection's first 4 KiB of exposure. It always
//     covers every connection in the table, so each gets a 4 KiB window at
//     its REQUEST or RESPONSE and gets it back whenever its host takes the
//     bytes: however many connections are open (up to MaxConns) and
//     whatever the others hold, every one can always send. New refuses a
//     MaxBuffered below the reserve (ErrBufferTotal); left 0, MaxBuffered
//     is 64 MiB or the reserve if more (DefaultMaxBufferedFor).
//   - the pool, the rest: exposures above 4 KiB. A stream connection's
//     window doubles, up to ConnBuffer, each time the guest uses half of
//     it since the fwd_cnt it was last told (growWindowLocked), taking the
//     growth from the pool; a window the pool cannot grow stays as it is
//     until the guest fills it again. So only connections whose guest
//     streams data hold more than 4 KiB, and one busy connection reaches
//     ConnBuffer after six updates (4 KiB to 256 KiB).
//
// Before every packet to the guest, a connection tops its exposure up to
// its target: its window, for streams at most its share of the budget,
// MaxBuffered / open connections (so busy connections share the pool), as
// far as the budget allows. When the pool is spent the connection is told
// a fwd_cnt behind what its host took, or (SEQPACKET) a smaller buf_alloc
// (CreditStalls counts these, and window growth the pool refused) and waits
// on the starved list. SEQPACKET connections aim for the full ConnBuffer
// from the start: a message is forwarded only whole, and a Linux guest
// refuses a message larger than the buf_alloc it was told (EMSGSIZE)
// rather than send part of it and wait, so such a window cannot grow on
// demand; an idle SEQPACKET connection therefore holds ConnBuffer of the
// pool, but its first 4 KiB, like any connection's, come from the reserve.
// Bytes a host socket takes and connections that close give budget back;
// when the pool gets some back, the RX worker sends each starved
// connection a CREDIT_UPDATE. A guest that sends past what it was granted
// is reset as before (an overrun), so the bound holds against a hostile
// guest too. Stats.BufferGranted is the budget in use.
//
// # Counters (Stats)
//
// Every counter is an atomic in Device.ctr, bumped by the goroutine that
// sees the event, with no lock and no map on the data path; Stats reads
// them from any goroutine (and takes the Lifecycle's lock only to find the session whose budget
// in use it reads). Connection outcomes are counted where a connection ends:
// ConnsEstablished when it reaches stateEstablished, ConnsRefused for an
// attempt that ends before (or never gets a table entry), ConnsReset for
// an established connection ended by an RST other than the one that
// answers SHUTDOWN(BOTH) (the act bits of connSM.abort and onGuestOp).
// RxQueueFull counts RX passes
// cut short because the guest had no RX buffer posted.
//
// # Untrusted guest
//
// Ring and descriptor errors stop the device (Activation.Fail ->
// DEVICE_NEEDS_RESET). Packet-level errors (bad length, credit overrun,
// unknown op, wrong state, a packet of the connection's other type) are
// counted and reset the connection. Each guest error is counted under its
// virtio.GuestErrorKind (Stats.GuestErrorsByKind: header, address, type, length,
// op, credit, queue). Guest data buffered for all
// connections together is bounded by MaxBuffered (above), and per
// connection by the advertised buffer (SEQPACKET: plus 4 bytes per queued
// message, and one host record in flight to the guest, which the guest's
// credit bounds);
// connections by MaxConns; queued RSTs by MaxConns+256.
package vsock
