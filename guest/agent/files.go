package agent

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/microvm/microvm/guest/agentapi"
)

// fileErr turns a file system error into a status.
func fileErr(op, path string, err error) error {
	code := codes.Internal
	switch {
	case errors.Is(err, fs.ErrNotExist):
		code = codes.NotFound
	case errors.Is(err, fs.ErrPermission), errors.Is(err, unix.EROFS):
		code = codes.PermissionDenied
	case errors.Is(err, unix.ENOTDIR), errors.Is(err, unix.EISDIR):
		code = codes.FailedPrecondition
	case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.EDQUOT):
		code = codes.ResourceExhausted
	}
	return status.Errorf(code, "agent: %s %s: %v", op, path, err)
}

// checkPath accepts absolute paths without NUL.
func checkPath(op, path string) error {
	if !filepath.IsAbs(path) || strings.IndexByte(path, 0) >= 0 {
		return status.Errorf(codes.InvalidArgument, "agent: %s %q: not an absolute path", op, path)
	}
	return nil
}

// PutFile writes the streamed file to a temporary file next to the target,
// syncs it, sets its mode and renames it over the target, so a reader sees
// the old file or the complete new one. A call that fails or is cancelled
// removes the temporary file.
func (s *Server) PutFile(stream agentapi.Agent_PutFileServer) (err error) {
	req, err := stream.Recv()
	if err != nil {
		return err
	}
	h := req.GetHeader()
	if h == nil {
		return status.Error(codes.InvalidArgument, "agent: put: the first message must be the header")
	}
	if err := checkPath("put", h.Path); err != nil {
		return err
	}
	if h.Mode&^0o7777 != 0 {
		return status.Errorf(codes.InvalidArgument, "agent: put %s: mode %#o has bits outside 07777", h.Path, h.Mode)
	}
	path := filepath.Clean(h.Path)
	dir := filepath.Dir(path)
	if h.MakeParents {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fileErr("put", path, err)
		}
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".agent-*")
	if err != nil {
		return fileErr("put", path, err)
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	var size uint64
	for {
		req, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err // the client cancelled, or the call broke
		}
		data := req.GetData()
		if data == nil && req.GetHeader() != nil {
			return status.Errorf(codes.InvalidArgument, "agent: put %s: header sent twice", path)
		}
		if _, err := f.Write(data); err != nil {
			return fileErr("put", path, err)
		}
		size += uint64(len(data))
	}
	if err := f.Sync(); err != nil {
		return fileErr("put", path, err)
	}
	// Chmod after the writes: writing may clear setuid and setgid bits.
	if err := f.Chmod(agentapi.FileMode(h.Mode)); err != nil {
		return fileErr("put", path, err)
	}
	if err := f.Close(); err != nil {
		return fileErr("put", path, err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fileErr("put", path, err)
	}
	return stream.SendAndClose(&agentapi.PutFileResponse{Size: size})
}

// GetFile streams a regular file: its mode and size at open, then its data
// in chunks of at most ChunkSize until EOF (a file that grows meanwhile is
// sent as far as it is read).
func (s *Server) GetFile(req *agentapi.GetFileRequest, stream agentapi.Agent_GetFileServer) error {
	if err := checkPath("get", req.Path); err != nil {
		return err
	}
	f, err := os.Open(req.Path)
	if err != nil {
		return fileErr("get", req.Path, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fileErr("get", req.Path, err)
	}
	if !fi.Mode().IsRegular() {
		return status.Errorf(codes.FailedPrecondition, "agent: get %s: not a regular file (%v)", req.Path, fi.Mode().Type())
	}
	info := &agentapi.FileInfo{Mode: agentapi.ModeBits(fi.Mode()), Size: uint64(fi.Size())}
	if err := stream.Send(&agentapi.GetFileResponse{Msg: &agentapi.GetFileResponse_Info{Info: info}}); err != nil {
		return err
	}
	for {
		buf := make([]byte, agentapi.ChunkSize) // Send may keep the message
		n, rerr := f.Read(buf)
		if n > 0 {
			if err := stream.Send(&agentapi.GetFileResponse{Msg: &agentapi.GetFileResponse_Data{Data: buf[:n]}}); err != nil {
				return err
			}
		}
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			return fileErr("get", req.Path, fmt.Errorf("read: %w", rerr))
		}
	}
}
