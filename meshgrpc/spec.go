package meshgrpc

import "github.com/inmesh/inmesh/destination"

func destinationSpec(authority string) destination.TrafficSpec {
	return destination.TrafficSpec{Authority: authority}
}
