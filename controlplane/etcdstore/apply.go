package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"

	"github.com/inmesh/inmesh/manifest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ErrConflict is returned by [Apply] and [Delete] when the keys kept
// changing under them for every attempt.
var ErrConflict = errors.New("etcdstore: the keys changed during every attempt; nothing written")

// applyAttempts bounds the attempts of a write whose keys changed between
// its read and its transaction.
const applyAttempts = 5

// Change is what [Apply] writes: manifest files and endpoints files, each
// named by the path given (its base name becomes the key's name, as in
// PREFIX/manifests/authors.yaml).
type Change struct {
	Manifests []manifest.File
	Endpoints []manifest.File
}

// Key is one key under the prefix, as [List] returns it.
type Key struct {
	Key         string
	Kind        string // ManifestsDir or EndpointsDir
	Name        string
	ModRevision int64
	Size        int
}

// Apply validates change together with the keys already under prefix, with
// the loader that replicas use ([manifest.LoadFiles] and
// [manifest.ParseEndpoints]), and writes every file of change in one etcd
// transaction, only if no key under prefix changed since it was read. A bad
// document is refused with the file, the document and the field named, and
// then nothing is written. A key given twice (two files of one base name)
// is an error. It returns the revision written.
func Apply(ctx context.Context, cli *clientv3.Client, prefix string, change Change) (int64, error) {
	prefix = cleanPrefix(prefix)
	puts := make(map[string][]byte)
	names := make(map[string]string)
	add := func(dir string, f manifest.File) error {
		name := filepath.Base(f.Name)
		if name == "." || name == "/" || name == "" {
			return fmt.Errorf("%q: no file name", f.Name)
		}
		key := prefix + "/" + dir + "/" + name
		if prev, dup := names[key]; dup {
			return fmt.Errorf("%s and %s would both be %s", prev, f.Name, key)
		}
		names[key] = f.Name
		puts[key] = f.Data
		return nil
	}
	for _, f := range change.Manifests {
		if err := add(ManifestsDir, f); err != nil {
			return 0, err
		}
	}
	for _, f := range change.Endpoints {
		if err := add(EndpointsDir, f); err != nil {
			return 0, err
		}
	}
	var ops []clientv3.Op
	for _, k := range slices.Sorted(maps.Keys(puts)) {
		ops = append(ops, clientv3.OpPut(k, string(puts[k])))
	}
	return write(ctx, cli, prefix, func(w *watcher) error {
		for k, v := range puts {
			w.put(k, v)
		}
		return nil
	}, names, ops)
}

// Delete removes the keys of the named files (base names, as [Apply]
// wrote them) in one transaction, once what is left validates; an unknown
// name is an error and then nothing is deleted.
func Delete(ctx context.Context, cli *clientv3.Client, prefix string, manifests, endpoints []string) (int64, error) {
	prefix = cleanPrefix(prefix)
	var keys []string
	for _, n := range manifests {
		keys = append(keys, prefix+"/"+ManifestsDir+"/"+filepath.Base(n))
	}
	for _, n := range endpoints {
		keys = append(keys, prefix+"/"+EndpointsDir+"/"+filepath.Base(n))
	}
	var ops []clientv3.Op
	for _, k := range keys {
		ops = append(ops, clientv3.OpDelete(k))
	}
	return write(ctx, cli, prefix, func(w *watcher) error {
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
			return fmt.Errorf("no such key: %s", strings.Join(missing, ", "))
		}
		return nil
	}, nil, ops)
}

// write reads every key under prefix, applies edit to that state,
// validates the result (naming a key by names[key] when given), and
// commits ops if no key under prefix changed since the read, trying again
// when one did.
func write(ctx context.Context, cli *clientv3.Client, prefix string, edit func(*watcher) error, names map[string]string, ops []clientv3.Op) (int64, error) {
	for range applyAttempts {
		resp, err := cli.Get(ctx, prefix+"/", clientv3.WithPrefix())
		if err != nil {
			return 0, fmt.Errorf("etcd: reading %s/: %w", prefix, err)
		}
		w := &watcher{prefix: prefix + "/", manifests: make(map[string][]byte), endpoints: make(map[string][]byte)}
		for _, kv := range resp.Kvs {
			w.put(string(kv.Key), kv.Value)
		}
		if err := edit(w); err != nil {
			return 0, err
		}
		if err := w.validate(names); err != nil {
			return 0, err
		}
		rev := resp.Header.Revision
		txn, err := cli.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(prefix+"/").WithPrefix(), "<", rev+1)).
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

// List returns the keys under prefix that replicas read, sorted.
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
		kind := w.kind(k)
		if kind == "" {
			continue
		}
		out = append(out, Key{Key: k, Kind: kind, Name: strings.TrimPrefix(k, prefix+"/"+kind+"/"),
			ModRevision: kv.ModRevision, Size: len(kv.Value)})
	}
	return out, nil
}
