package agent

import (
	"errors"
	"io"
	"os"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/microvm/microvm/guest/agentapi"
	"github.com/microvm/microvm/internal/dirtar"
)

// PutTree unpacks the tar archive the client streams into the directory
// its first message names (package dirtar: nothing lands outside it).
// Owners are kept when the agent runs as root.
func (s *Server) PutTree(stream agentapi.Agent_PutTreeServer) error {
	req, err := stream.Recv()
	if err != nil {
		return err
	}
	dir, ok := req.Msg.(*agentapi.PutTreeRequest_Dir)
	if !ok {
		return status.Error(codes.InvalidArgument, "agent: put tree: the first message must name the directory")
	}
	if err := checkPath("put tree", dir.Dir); err != nil {
		return err
	}
	r := &treeReader{stream: stream}
	st, err := dirtar.Extract(r, dir.Dir, dirtar.Options{Chown: os.Geteuid() == 0, KeepSpecial: true}) // the host user chose what goes in
	if err != nil {
		if r.err != nil { // the stream broke, not the archive
			return r.err
		}
		if errors.Is(err, dirtar.ErrUnsafe) {
			return status.Errorf(codes.InvalidArgument, "agent: put tree %s: %v", dir.Dir, err)
		}
		return fileErr("put tree", dir.Dir, err)
	}
	// Whatever follows the archive's end (tar's zero blocks) is read and
	// dropped, so that the client's CloseSend is seen.
	if _, err := io.Copy(io.Discard, r); err != nil {
		return err
	}
	return stream.SendAndClose(&agentapi.PutTreeResponse{Entries: uint64(st.Entries), Bytes: uint64(st.Bytes), Skipped: uint64(st.Skipped)})
}

// treeReader reads a PutTree stream's data messages.
type treeReader struct {
	stream agentapi.Agent_PutTreeServer
	buf    []byte
	err    error // a broken stream, as opposed to its end
}

func (r *treeReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		req, err := r.stream.Recv()
		if err == io.EOF {
			return 0, io.EOF
		}
		if err != nil {
			r.err = err
			return 0, err
		}
		d, ok := req.Msg.(*agentapi.PutTreeRequest_Data)
		if !ok {
			r.err = status.Error(codes.InvalidArgument, "agent: put tree: only the first message names the directory")
			return 0, r.err
		}
		r.buf = d.Data
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

// GetTree streams the directory or file the request names as a tar
// archive, in chunks of at most agentapi.ChunkSize.
func (s *Server) GetTree(req *agentapi.GetTreeRequest, stream agentapi.Agent_GetTreeServer) error {
	if err := checkPath("get tree", req.Path); err != nil {
		return err
	}
	if _, err := os.Lstat(req.Path); err != nil {
		return fileErr("get tree", req.Path, err)
	}
	w := &treeWriter{stream: stream}
	if _, err := dirtar.Write(w, req.Path); err != nil {
		if w.err != nil {
			return w.err
		}
		return fileErr("get tree", req.Path, err)
	}
	return w.flush()
}

// treeWriter sends what is written to it in chunks.
type treeWriter struct {
	stream agentapi.Agent_GetTreeServer
	buf    []byte
	err    error
}

func (w *treeWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		k := min(len(p), agentapi.ChunkSize-len(w.buf))
		w.buf = append(w.buf, p[:k]...)
		p = p[k:]
		if len(w.buf) == agentapi.ChunkSize {
			if err := w.flush(); err != nil {
				return 0, err
			}
		}
	}
	return n, nil
}

func (w *treeWriter) flush() error {
	if len(w.buf) == 0 {
		return nil
	}
	if err := w.stream.Send(&agentapi.GetTreeResponse{Data: w.buf}); err != nil {
		w.err = err
		return err
	}
	w.buf = nil // Send may keep the message
	return nil
}
