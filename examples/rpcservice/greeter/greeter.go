// Package greeter is the example's own gRPC service, shared by the guest
// program (cmd/greeterd, in the VM) and the host program that calls it
// through microvm's DialVsock. It is defined without protoc: a hand-written
// grpc.ServiceDesc and a JSON codec, which is all gRPC needs; a real
// service would usually generate this code from a .proto file instead.
package greeter

import (
	"context"
	"encoding/json"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
)

// Port is the guest vsock port the service listens on.
const Port = 5000

// Request and Reply are the messages, encoded as JSON.
type Request struct {
	Name string `json:"name"`
}

// Reply is the answer to Greet.
type Reply struct {
	Message string `json:"message"`
	Kernel  string `json:"kernel"`
}

// Server is what the guest implements.
type Server interface {
	Greet(context.Context, *Request) (*Reply, error)
}

// codec encodes messages as JSON; both sides select it by name.
type codec struct{}

func (codec) Marshal(v any) ([]byte, error)   { return json.Marshal(v) }
func (codec) Unmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }
func (codec) Name() string                    { return CodecName }

// CodecName is the gRPC content subtype of the JSON codec.
const CodecName = "json"

func init() { encoding.RegisterCodec(codec{}) }

// ServiceDesc describes the service to grpc.Server.RegisterService.
var ServiceDesc = grpc.ServiceDesc{
	ServiceName: "example.Greeter",
	HandlerType: (*Server)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Greet",
		Handler: func(srv any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			var req Request
			if err := dec(&req); err != nil {
				return nil, err
			}
			return srv.(Server).Greet(ctx, &req)
		},
	}},
}

// Greet calls the service on cc.
func Greet(ctx context.Context, cc grpc.ClientConnInterface, name string) (*Reply, error) {
	var r Reply
	err := cc.Invoke(ctx, "/example.Greeter/Greet", &Request{Name: name}, &r, grpc.CallContentSubtype(CodecName))
	return &r, err
}
