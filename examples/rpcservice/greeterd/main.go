//go:build linux

// Command greeterd is the guest side of the rpcservice example: the user's
// own gRPC service, listening on AF_VSOCK port greeter.Port inside the VM.
// Build it static (CGO_ENABLED=0) and add it to the guest image.
package main

import (
	"context"
	"fmt"
	"log"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"

	"github.com/microvm/microvm/examples/rpcservice/greeter"
	"github.com/microvm/microvm/guest/vsocknet"
)

type server struct{}

func (server) Greet(_ context.Context, r *greeter.Request) (*greeter.Reply, error) {
	var u unix.Utsname
	_ = unix.Uname(&u)
	return &greeter.Reply{
		Message: fmt.Sprintf("hello, %s, from inside the VM", r.Name),
		Kernel:  unix.ByteSliceToString(u.Release[:]),
	}, nil
}

func main() {
	ln, err := vsocknet.Listen(greeter.Port)
	if err != nil {
		log.Fatal(err)
	}
	s := grpc.NewServer()
	s.RegisterService(&greeter.ServiceDesc, server{})
	log.Fatal(s.Serve(ln))
}
