package etcdstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"

	"github.com/inmesh/inmesh/manifest"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ErrConflict is returned by [Apply] and [Delete] when the keys kept
// changing under them for every attempt.
var ErrConflict = errors.New("etcdstore: the keys changed during every attempt; nothing written")

// applyAttempts bounds the attempts of a write whose keys changed between
// its read and its transaction.
const applyAttempts = 5

// Change is what [Apply] writes and [Delete] removes: manifest files,
// each resource of which has its own key (PREFIX/manifests/KIND/NAMESPACE/NAME,
// or PREFIX/manifests/ServiceProfile/NAME for a ServiceProfile in its
// Service's namespace, PREFIX/manifests/ServiceProfile/NAMESPACE/NAME in a
// client's), as kubectl apply keeps one
// object per resource, and endpoints files, kept whole under their base
// name (PREFIX/endpoints/endpoints.yaml). Each file is named by the path
// given, which errors name.
type Change struct {
	Manifests []manifest.File
	Endpoints []manifest.File
}

// Key is one key under the prefix, as [List] returns it.
type Key struct {
	Key string
	// Name is the key under the prefix, such as
	// "manifests/HTTPRoute/default/authors" or "endpoints/endpoints.yaml":
	// what [Delete] takes.
	Name        string
	ModRevision int64
	Size        int
}

// ResourceName returns the name under the prefix of a resource's key.
func ResourceName(d manifest.Document) string {
	if d.Namespace == "" {
		return ManifestsDir + "/" + d.Kind + "/" + d.Name
	}
	return ManifestsDir + "/" + d.Kind + "/" + d.Namespace + "/" + d.Name
}

// split validates change alone (errors name the file, the document and the
// field) and returns its keys' names under the prefix, their values and
// the file each comes from.
func split(change Change) (names []string, values map[string][]byte, from map[string]string, err error) {
	if _, err := manifest.LoadFiles(change.Manifests...); err != nil {
		return nil, nil, nil, err
	}
	values, from = make(map[string][]byte), make(map[string]string)
	for _, f := range change.Manifests {
		docs, err := manifest.SplitResources(f.Data)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("%s: %w", f.Name, err)
		}
		for _, d := range docs {
			n := ResourceName(d)
			names = append(names, n)
			values[n], from[n] = d.Data, f.Name
		}
	}
	for _, f := range change.Endpoints {
		if _, err := manifest.ParseEndpoints(f.Data); err != nil {
			return nil, nil, nil, fmt.Errorf("%s: %w", f.Name, err)
		}
		base := filepath.Base(f.Name)
		if base == "." || base == "/" {
			return nil, nil, nil, fmt.Errorf("%q: no file name", f.Name)
		}
		n := EndpointsDir + "/" + base
		if prev, dup := from[n]; dup {
			return nil, nil, nil, fmt.Errorf("%s and %s would both be %s", prev, f.Name, n)
		}
		names = append(names, n)
		values[n], from[n] = f.Data, f.Name
	}
	return names, values, from, nil
}

// Names returns the names under the prefix of the keys that change would
// write: what [Delete] takes to remove them again.
func Names(change Change) ([]string, error) {
	names, _, _, err := split(change)
	return names, err
}

// Action is what [ApplyReport] did to one key, in kubectl apply's words.
type Action string

// The actions of [ApplyReport].
const (
	// Created: the key did not exist and was written.
	Created Action = "created"
	// Configured: the key held other bytes and was rewritten.
	Configured Action = "configured"
	// Unchanged: the key held these very bytes and was not written; its
	// mod revision stays.
	Unchanged Action = "unchanged"
)

// Report is the outcome of [ApplyReport].
type Report struct {
	// Revision is the revision of the transaction that wrote the change,
	// or, when every key was unchanged and nothing was written, etcd's
	// revision when the keys were read.
	Revision int64
	// Keys are the keys of the change in its order (its manifest files'
	// documents, then its endpoints files), each with what was done.
	Keys []KeyAction
}

// KeyAction is one key of a [Report].
type KeyAction struct {
	// Name is the key under the prefix, as [Names] and [List] give it.
	Name   string
	Action Action
}

// Apply is [ApplyReport] for a caller that needs only the revision.
func Apply(ctx context.Context, cli *clientv3.Client, prefix string, change Change) (int64, error) {
	r, err := ApplyReport(ctx, cli, prefix, change)
	return r.Revision, err
}

// ApplyReport validates change with the loader that replicas use
// ([manifest.LoadFiles] and [manifest.ParseEndpoints]), alone and then
// together with the keys already under prefix, and writes the keys whose
// bytes differ from what etcd holds, in one etcd transaction; a key that
// already holds the very bytes of its document is left alone (its mod
// revision stays, and no replica sees an event for it). The transaction
// commits only if no manifest or endpoints key under prefix changed since
// the read, and each written key still has the mod revision read (none
// for a new key); otherwise everything is read, compared and validated
// again. A bad document is refused with the file, the document and the
// field named, and then nothing is written. The report says, per key,
// whether it was created, configured or unchanged.
func ApplyReport(ctx context.Context, cli *clientv3.Client, prefix string, change Change) (Report, error) {
	prefix = cleanPrefix(prefix)
	names, values, from, err := split(change)
	if err != nil {
		return Report{}, err
	}
	keyed := make(map[string]string, len(from))
	for _, n := range names {
		k := prefix + "/" + n
		keyed[k] = from[n] + " (" + k + ")"
	}
	var keys []KeyAction
	rev, err := write(ctx, cli, prefix, func(w *watcher, stored map[string]*mvccpb.KeyValue) ([]clientv3.Op, []clientv3.Cmp, error) {
		keys = make([]KeyAction, 0, len(names))
		var ops []clientv3.Op
		var cmps []clientv3.Cmp
		for _, n := range names {
			k, v := prefix+"/"+n, values[n]
			kv := stored[k]
			switch {
			case kv == nil:
				keys = append(keys, KeyAction{Name: n, Action: Created})
			case bytes.Equal(kv.Value, v):
				// Not written, but the state validated has it: a key
				// deleted or changed since the read fails the
				// transaction, which no prefix comparison notices of
				// a deleted key.
				keys = append(keys, KeyAction{Name: n, Action: Unchanged})
				cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k), "=", kv.ModRevision))
				continue
			default:
				keys = append(keys, KeyAction{Name: n, Action: Configured})
			}
			var modRev int64 // 0: the key must still not exist
			if kv != nil {
				modRev = kv.ModRevision
			}
			w.put(k, v)
			ops = append(ops, clientv3.OpPut(k, string(v)))
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k), "=", modRev))
		}
		return ops, cmps, nil
	}, keyed)
	if err != nil {
		return Report{}, err
	}
	return Report{Revision: rev, Keys: keys}, nil
}

// Delete removes the keys of names (under the prefix, as [List] and
// [Names] give them) in one transaction, once what is left validates; an
// unknown name is an error and then nothing is deleted.
func Delete(ctx context.Context, cli *clientv3.Client, prefix string, names []string) (int64, error) {
	prefix = cleanPrefix(prefix)
	var keys []string
	var ops []clientv3.Op
	for _, n := range names {
		k := prefix + "/" + strings.TrimPrefix(n, "/")
		keys = append(keys, k)
		ops = append(ops, clientv3.OpDelete(k))
	}
	return write(ctx, cli, prefix, func(w *watcher, _ map[string]*mvccpb.KeyValue) ([]clientv3.Op, []clientv3.Cmp, error) {
		var missing []string
		for _, k := range keys {
			_, m := w.manifests[k]
			_, e := w.endpoints[k]
			if !m && !e {
				missing = append(missing, k)
			}
			w.delete(k)
		}
		if len(missing) > 0 {
			return nil, nil, fmt.Errorf("no such key: %s", strings.Join(missing, ", "))
		}
		return ops, nil, nil
	}, nil)
}

// write reads every key under prefix, lets plan edit that state (given
// the keys read) and say what to write and what to compare besides,
// validates the result (naming a key by names[key] when given), and
// commits the ops if no manifest or endpoints key changed since the read
// and plan's comparisons hold, trying again when they do not. With no
// ops nothing is written, and the revision read is returned.
func write(ctx context.Context, cli *clientv3.Client, prefix string, plan func(w *watcher, stored map[string]*mvccpb.KeyValue) ([]clientv3.Op, []clientv3.Cmp, error), names map[string]string) (int64, error) {
	for range applyAttempts {
		resp, err := cli.Get(ctx, prefix+"/", clientv3.WithPrefix())
		if err != nil {
			return 0, fmt.Errorf("etcd: reading %s/: %w", prefix, err)
		}
		w := &watcher{prefix: prefix + "/", manifests: make(map[string][]byte), endpoints: make(map[string][]byte),
			registrations: make(map[string][]byte)}
		stored := make(map[string]*mvccpb.KeyValue, len(resp.Kvs))
		for _, kv := range resp.Kvs {
			w.put(string(kv.Key), kv.Value)
			stored[string(kv.Key)] = kv
		}
		ops, cmps, err := plan(w, stored)
		if err != nil {
			return 0, err
		}
		if err := w.validate(names); err != nil {
			return 0, err
		}
		rev := resp.Header.Revision
		if len(ops) == 0 {
			return rev, nil
		}
		// Only manifests and endpoints are validated together; the
		// registrations that workloads write and remove all the time
		// must not make a change conflict.
		txn, err := cli.Txn(ctx).
			If(append([]clientv3.Cmp{
				clientv3.Compare(clientv3.ModRevision(prefix+"/"+ManifestsDir+"/").WithPrefix(), "<", rev+1),
				clientv3.Compare(clientv3.ModRevision(prefix+"/"+EndpointsDir+"/").WithPrefix(), "<", rev+1),
			}, cmps...)...).
			Then(ops...).
			Commit()
		if err != nil {
			return 0, fmt.Errorf("etcd: writing under %s/: %w", prefix, err)
		}
		if txn.Succeeded {
			return txn.Header.Revision, nil
		}
	}
	return 0, ErrConflict
}

// validate loads the state as a replica would, naming each key by
// names[key] when given (the user's file).
func (w *watcher) validate(names map[string]string) error {
	var files []manifest.File
	for _, k := range slices.Sorted(maps.Keys(w.manifests)) {
		name := k
		if n, ok := names[k]; ok {
			name = n
		}
		files = append(files, manifest.File{Name: name, Data: w.manifests[k]})
	}
	if _, err := manifest.LoadFiles(files...); err != nil {
		return err
	}
	renamed := make(map[string][]byte, len(w.endpoints))
	for k, v := range w.endpoints {
		if n, ok := names[k]; ok {
			k = n
		}
		renamed[k] = v
	}
	_, err := (&watcher{endpoints: renamed}).parseEndpoints()
	return err
}

// List returns the keys under prefix that replicas read, sorted, but for
// the replicas' own addresses.
func List(ctx context.Context, cli *clientv3.Client, prefix string) ([]Key, error) {
	prefix = cleanPrefix(prefix)
	resp, err := cli.Get(ctx, prefix+"/", clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("etcd: reading %s/: %w", prefix, err)
	}
	w := &watcher{prefix: prefix + "/"}
	var out []Key
	for _, kv := range resp.Kvs {
		k := string(kv.Key)
		if kind := w.kind(k); kind == "" || kind == ReplicasDir {
			continue
		}
		out = append(out, Key{Key: k, Name: strings.TrimPrefix(k, prefix+"/"), ModRevision: kv.ModRevision, Size: len(kv.Value)})
	}
	return out, nil
}
