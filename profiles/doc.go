// Package profiles holds the service-profile model of inmesh and its
// compiler: a [Profile] is the routes of one destination (each with its
// request match, response classes, metric labels, retryability and
// timeout), its retry budget and its traffic split, as plain data that a
// [Source] streams and that users may also build by hand. [Compile] turns
// a profile into an immutable route [Table] (first match wins), leaving
// out the parts that do not compile as Linkerd's proxy does and naming
// them ([Table.Dropped]); a [Budget] runs a retry budget as tower's
// TpsBudget. The router that
// executes these tables is package router.
//
// Profiles come from a [Source]: the destination client (a Linkerd control
// plane or inmesh's embedded one), a [StaticSource], or the files a
// manifest.ProfileSource watches. The ServiceProfile YAML of Linkerd's CRD
// (apiVersion linkerd.io/v1alpha2) is read by [ParseServiceProfiles].
//
// The model is plain data: the package imports no protobuf, no control
// plane and no balancer (destination.ProfileFromProto decodes the wire
// form). A traffic split's targets and a profile's endpoint are the types
// of package github.com/inmesh/inmesh/balancer/endpoint, and [Splits]
// offers a Source's dst overrides to balancer.WithSplits.
package profiles
