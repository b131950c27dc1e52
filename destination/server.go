package destination

import (
	"log/slog"
	"net/netip"

	pb "github.com/inmesh/inmesh/destination/destinationpb"
	"github.com/inmesh/inmesh/destination/outboundpb"
	authpkg "github.com/inmesh/inmesh/internal/authority"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Server is an embedded Destination control plane serving a [Store]. It
// follows the contract of Linkerd's controller: the first message of every
// stream is sent at once and describes the whole state (an add with every
// endpoint, or no_endpoints); an unknown service gets
// no_endpoints{exists: false} from Get and a default profile (no routes,
// [profiles.DefaultRetryBudget]) from GetProfile; an authority that is not
// host:port gets InvalidArgument. Every later change of the Store is pushed
// at once.
type Server struct {
	pb.UnimplementedDestinationServer
	store *Store
	log   *slog.Logger
}

var _ pb.DestinationServer = (*Server)(nil)

// NewServer returns a Server for store; a nil logger means slog.Default().
func NewServer(store *Store, log *slog.Logger) *Server {
	if log == nil {
		log = slog.Default()
	}
	return &Server{store: store, log: log}
}

// Register adds the Destination and OutboundPolicies services to g.
func (s *Server) Register(g *grpc.Server) {
	pb.RegisterDestinationServer(g, s)
	outboundpb.RegisterOutboundPoliciesServer(g, &policyServer{store: s.store})
}

// GetProfile streams the profile of the requested authority.
func (s *Server) GetProfile(req *pb.GetDestination, stream grpc.ServerStreamingServer[pb.DestinationProfile]) error {
	host, port, err := authpkg.Split(req.GetPath())
	if err != nil {
		return status.Errorf(codes.InvalidArgument, "invalid authority: %v", err)
	}
	var last *pb.DestinationProfile
	for {
		p, changed := s.store.profile(host, port)
		msg := ProfileToProto(p)
		if last == nil || !proto.Equal(msg, last) {
			if err := stream.Send(msg); err != nil {
				return err
			}
			last = msg
		}
		select {
		case <-changed:
		case <-stream.Context().Done():
			return nil
		}
	}
}

// Get streams the endpoints of the requested authority as adds and removes
// against what the stream already sent.
func (s *Server) Get(req *pb.GetDestination, stream grpc.ServerStreamingServer[pb.Update]) error {
	authority, err := authpkg.Normalize(req.GetPath())
	if err != nil {
		return status.Errorf(codes.InvalidArgument, "invalid authority: %v", err)
	}
	sent := map[netip.AddrPort]*pb.WeightedAddr{}
	first := true
	var lastExists bool
	for {
		eps, exists, changed := s.store.endpointSet(authority)
		for _, msg := range endpointDiff(sent, eps, exists, first || exists != lastExists) {
			if err := stream.Send(msg); err != nil {
				return err
			}
		}
		first, lastExists = false, exists
		select {
		case <-changed:
		case <-stream.Context().Done():
			return nil
		}
	}
}

// endpointDiff returns the updates that take a stream from sent to eps, and
// updates sent. announce forces a message even when nothing changed (the
// first message of a stream, or a change of existence).
func endpointDiff(sent map[netip.AddrPort]*pb.WeightedAddr, eps []Endpoint, exists, announce bool) []*pb.Update {
	if len(eps) == 0 {
		if len(sent) == 0 && !announce {
			return nil
		}
		clear(sent)
		return []*pb.Update{{Update: &pb.Update_NoEndpoints{NoEndpoints: &pb.NoEndpoints{Exists: exists}}}}
	}
	var out []*pb.Update
	current := make(map[netip.AddrPort]bool, len(eps))
	var removed []*pb.TcpAddress
	for _, e := range eps {
		current[e.Addr] = true
	}
	for addr := range sent {
		if !current[addr] {
			removed = append(removed, AddrToProto(addr))
			delete(sent, addr)
		}
	}
	var added []*pb.WeightedAddr
	for _, e := range eps {
		w := EndpointToProto(e)
		if prev, ok := sent[e.Addr]; !ok || !proto.Equal(prev, w) {
			added = append(added, w)
			sent[e.Addr] = w
		}
	}
	// Adds go first so that a stream never passes through an empty set
	// that did not exist.
	if len(added) > 0 {
		out = append(out, &pb.Update{Update: &pb.Update_Add{Add: &pb.WeightedAddrSet{Addrs: added}}})
	}
	if len(removed) > 0 {
		out = append(out, &pb.Update{Update: &pb.Update_Remove{Remove: &pb.AddrSet{Addrs: removed}}})
	}
	return out
}
