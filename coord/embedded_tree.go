package coord

import (
	"fmt"
	"slices"
)

// tree is the embedded server's data: entries by key, with ZooKeeper's versioning rules.
type tree struct {
	nodes map[string]*enode
	rev   int64 // last committed revision (zxid)
}

type enode struct {
	value     []byte
	version   int64
	cversion  int64
	createRev int64
	modRev    int64
	owner     int64
	children  map[string]struct{}
}

func (n *enode) entry(key string) Entry {
	return Entry{Key: key, Value: slices.Clone(n.value), Version: n.version,
		CreateRev: n.createRev, ModRev: n.modRev, Owner: n.owner}
}

func newTree() *tree {
	return &tree{nodes: map[string]*enode{"/": {children: map[string]struct{}{}}}}
}

// changes collects what one change touched: the revision it runs at, the watches to fire
// once it is committed, and how to undo it until then.
type changes struct {
	rev        int64
	used       bool
	data       map[string]bool
	child      map[string]bool
	persistent bool // a persistent entry (or its children list) changed
	// undo restores what the change altered, run last first (rollback): a change is made
	// on the live tree, under the server's lock, and undone whole when a later op of its
	// transaction fails or its save does.
	undo []func()
}

func (t *tree) begin() *changes {
	return &changes{rev: t.rev + 1, data: map[string]bool{}, child: map[string]bool{}}
}

func (t *tree) touched(c *changes) {
	if !c.used {
		c.used = true
		prev := t.rev
		t.rev = c.rev
		c.undo = append(c.undo, func() { t.rev = prev })
	}
}

// rollback undoes every alteration of c, leaving the tree as it was before c began.
func (c *changes) rollback() {
	for i := len(c.undo) - 1; i >= 0; i-- {
		c.undo[i]()
	}
	c.undo = nil
}

// create adds key. With parents, missing ancestors are created as persistent entries.
// Everything is checked before anything changes.
func (t *tree) create(c *changes, key string, value []byte, mode Mode, sid int64, parents bool) (string, error) {
	if key == "/" {
		return "", fmt.Errorf("%w: the root key cannot be created", ErrInvalid)
	}
	anc := ancestors(key)
	var missing []string
	for _, a := range anc {
		n, ok := t.nodes[a]
		switch {
		case !ok && !parents:
			return "", fmt.Errorf("%w: parent %s", ErrNotFound, a)
		case !ok:
			missing = append(missing, a)
		case n.owner != 0:
			return "", fmt.Errorf("%w: %s is ephemeral and cannot have children", ErrInvalid, a)
		}
	}
	parent := parentKey(key)
	name := key
	if mode.sequential() {
		var seq int64
		if p, ok := t.nodes[parent]; ok {
			seq = p.cversion
		}
		name = fmt.Sprintf("%s%010d", key, seq)
	}
	if _, ok := t.nodes[name]; ok {
		return "", ErrExists
	}
	t.touched(c)
	for _, a := range missing {
		t.add(c, a, nil, 0)
	}
	var owner int64
	if mode.ephemeral() {
		owner = sid
	}
	t.add(c, name, value, owner)
	return name, nil
}

func (t *tree) add(c *changes, key string, value []byte, owner int64) {
	t.nodes[key] = &enode{value: slices.Clone(value), createRev: c.rev, modRev: c.rev,
		owner: owner, children: map[string]struct{}{}}
	p := t.nodes[parentKey(key)]
	cv := p.cversion
	c.undo = append(c.undo, func() {
		delete(t.nodes, key)
		delete(p.children, baseName(key))
		p.cversion = cv
	})
	p.children[baseName(key)] = struct{}{}
	p.cversion++
	c.data[key] = true
	c.child[parentKey(key)] = true
	c.persistent = true
}

func (t *tree) set(c *changes, key string, value []byte, version int64) (int64, error) {
	n, ok := t.nodes[key]
	if !ok {
		return 0, ErrNotFound
	}
	if version != AnyVersion && version != n.version {
		return 0, fmt.Errorf("%w: have version %d, want %d", ErrConflict, n.version, version)
	}
	t.touched(c)
	value0, version0, modRev0 := n.value, n.version, n.modRev
	c.undo = append(c.undo, func() { n.value, n.version, n.modRev = value0, version0, modRev0 })
	n.value = slices.Clone(value)
	n.version++
	n.modRev = c.rev
	c.data[key] = true
	if n.owner == 0 {
		c.persistent = true
	}
	return n.version, nil
}

func (t *tree) remove(c *changes, key string, version int64) error {
	if key == "/" {
		return fmt.Errorf("%w: the root key cannot be deleted", ErrInvalid)
	}
	n, ok := t.nodes[key]
	if !ok {
		return ErrNotFound
	}
	if version != AnyVersion && version != n.version {
		return fmt.Errorf("%w: have version %d, want %d", ErrConflict, n.version, version)
	}
	if len(n.children) > 0 {
		return ErrNotEmpty
	}
	t.touched(c)
	delete(t.nodes, key)
	p := t.nodes[parentKey(key)]
	cv := p.cversion
	c.undo = append(c.undo, func() {
		t.nodes[key] = n
		p.children[baseName(key)] = struct{}{}
		p.cversion = cv
	})
	delete(p.children, baseName(key))
	p.cversion++
	c.data[key] = true
	c.child[key] = true
	c.child[parentKey(key)] = true
	c.persistent = true
	return nil
}

func (t *tree) check(key string, version int64) error {
	n, ok := t.nodes[key]
	if !ok {
		return ErrNotFound
	}
	if version != AnyVersion && version != n.version {
		return fmt.Errorf("%w: have version %d, want %d", ErrConflict, n.version, version)
	}
	return nil
}
