// Package profiles holds the service-profile model of inmesh: a [Profile]
// is the routes of one destination (each with its request match, response
// classes, metric labels, retryability and timeout), its retry budget and
// its traffic split, as plain data that a [Source] streams and that users
// may also build by hand.
//
// Profiles come from a [Source]: the destination client (a Linkerd control
// plane or inmesh's embedded one), or a static or file source. The
// ServiceProfile YAML of Linkerd's CRD (apiVersion linkerd.io/v1alpha2) is
// read by [ParseServiceProfiles].
package profiles
