package dsa

import (
	"fmt"
	"sync"

	"k3/compute"
)

// PageSize is the positions one cache page holds: a multiple of the
// attention kernels' 64-position block, so that no block straddles pages.
const PageSize = 64

// Pool hands out the cache pages of one layer shape: each holds PageSize
// positions of the normed latent, the rope key and the index key. A page
// is reference-counted: a Fork shares its parent's full pages, and a
// shared page is copied before anything writes into it.
type Pool struct {
	b          compute.Backend
	dc, dr, di int
	// Account, when set, is told every page allocation (+bytes) and
	// release (-bytes): the owner's memory ledger.
	Account func(delta int64)
	// Slabs, when set before the first page, makes pages rows of slabs:
	// one buffer holding that many pages at first, each later slab as
	// many pages as the pool holds already, up to MaxSlab. A slab's
	// rows of each kind are one tensor (Slab), so that a pass over
	// sequences whose pages share a slab can name them by a page table
	// (the seam's PageTable), as a device's block table does. Slab
	// memory is accounted a slab at a time and given back by Trim once
	// the whole slab is free.
	Slabs int

	mu    sync.Mutex
	live  int     // pages held by caches
	free  []*Page // released pages kept for reuse, at most MaxFree
	slabs []*Slab
}

// MaxSlab is the most pages a slab holds.
const MaxSlab = 256

// A Slab is pages of a pool in one buffer: per kind a tensor of all its
// pages' rows, page i being rows i·PageSize onwards.
type Slab struct {
	buf compute.Tensor
	// KV [n·PageSize, 1, Dc] (MLA's latent as attention's keys), PE
	// [n·PageSize, dr] and IK [n·PageSize, DI] (zero without an indexer).
	KV, PE, IK compute.Tensor
	pages      []*Page
	free       []int // indices of free pages, the lowest last
}

// MaxFree is the released pages a pool keeps for reuse, so that decoding
// in steady state takes its new pages without allocating. They stay
// counted by Account until Trim gives them back.
const MaxFree = 64

// NewPool makes a pool of pages for layers of cfg on b.
func NewPool(b compute.Backend, cfg Config) *Pool {
	p := &Pool{b: b, dc: cfg.KVLoRARank, dr: cfg.RopeDim}
	if cfg.Indexer != nil {
		p.di = cfg.Indexer.HeadDim
	}
	return p
}

// PageBytes is the memory of one page.
func (p *Pool) PageBytes() int64 { return int64(PageSize) * int64(p.rowLen()) * 4 }

// Pages returns the pages caches hold, and the free pages kept for reuse.
func (p *Pool) Pages() (live, free int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	free = len(p.free)
	for _, sl := range p.slabs {
		free += len(sl.free)
	}
	return p.live, free
}

// Trim gives free pages back to the backend until at least n bytes are
// released or none are left, and returns the bytes released; pages of
// slabs go back a whole free slab at a time.
func (p *Pool) Trim(n int64) int64 {
	var done int64
	for done < n {
		p.mu.Lock()
		i := len(p.slabs) - 1
		for i >= 0 && len(p.slabs[i].free) < len(p.slabs[i].pages) {
			i--
		}
		if i < 0 {
			p.mu.Unlock()
			break
		}
		sl := p.slabs[i]
		p.slabs = append(p.slabs[:i], p.slabs[i+1:]...)
		p.mu.Unlock()
		p.b.Free(sl.buf)
		bytes := int64(len(sl.pages)) * p.PageBytes()
		if p.Account != nil {
			p.Account(-bytes)
		}
		done += bytes
	}
	for done < n {
		p.mu.Lock()
		if len(p.free) == 0 {
			p.mu.Unlock()
			break
		}
		pg := p.free[len(p.free)-1]
		p.free[len(p.free)-1] = nil
		p.free = p.free[:len(p.free)-1]
		p.mu.Unlock()
		p.destroy(pg)
		done += p.PageBytes()
	}
	return done
}

func (p *Pool) destroy(pg *Page) {
	p.b.Free(pg.buf)
	if p.Account != nil {
		p.Account(-p.PageBytes())
	}
}

func (p *Pool) rowLen() int { return p.dc + max(p.dr, 1) + p.di }

// Page is one page: PageSize rows of each kind, views into one buffer,
// and who holds it.
type Page struct {
	buf, kv, pe, ik compute.Tensor
	refs            int // caches holding the page; guarded by the pool's mu
	slab            *Slab
	index           int32 // the page's place in its slab
}

func (p *Pool) alloc() (*Page, error) {
	if p.Slabs > 0 {
		return p.allocInSlab()
	}
	p.mu.Lock()
	if n := len(p.free); n > 0 {
		pg := p.free[n-1]
		p.free[n-1] = nil
		p.free = p.free[:n-1]
		pg.refs = 1
		p.live++
		p.mu.Unlock()
		return pg, nil
	}
	p.mu.Unlock()
	pg := &Page{refs: 1}
	var err error
	if pg.buf, err = p.b.Alloc(compute.F32, PageSize*p.rowLen()); err != nil {
		return nil, err
	}
	// Kind after kind, each PageSize rows: the latent, the rope key, the
	// index key.
	a, b := PageSize*p.dc, PageSize*(p.dc+max(p.dr, 1))
	pg.kv = pg.buf.Rows(0, a).Reshape(PageSize, p.dc)
	pg.pe = pg.buf.Rows(a, b).Reshape(PageSize, max(p.dr, 1))
	if p.di > 0 {
		pg.ik = pg.buf.Rows(b, PageSize*p.rowLen()).Reshape(PageSize, p.di)
	}
	p.mu.Lock()
	p.live++
	p.mu.Unlock()
	if p.Account != nil {
		p.Account(p.PageBytes())
	}
	return pg, nil
}

// allocInSlab takes the first free page of the first slab with one (so
// that sequences pack into few slabs), making a slab when none has room.
func (p *Pool) allocInSlab() (*Page, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var sl *Slab
	for _, s := range p.slabs {
		if len(s.free) > 0 {
			sl = s
			break
		}
	}
	if sl == nil {
		total := 0
		for _, s := range p.slabs {
			total += len(s.pages)
		}
		var err error
		if sl, err = p.newSlab(min(max(p.Slabs, total), MaxSlab)); err != nil {
			return nil, err
		}
		p.slabs = append(p.slabs, sl)
	}
	i := sl.free[len(sl.free)-1]
	sl.free = sl.free[:len(sl.free)-1]
	pg := sl.pages[i]
	pg.refs = 1
	p.live++
	return pg, nil
}

// newSlab allocates a slab of n pages, each kind's rows together; p.mu
// is held.
func (p *Pool) newSlab(n int) (*Slab, error) {
	buf, err := p.b.Alloc(compute.F32, n*PageSize*p.rowLen())
	if err != nil {
		return nil, err
	}
	rows, dr := n*PageSize, max(p.dr, 1)
	sl := &Slab{buf: buf, pages: make([]*Page, n), free: make([]int, n)}
	kv := buf.Rows(0, rows*p.dc).Reshape(rows, p.dc)
	pe := buf.Rows(rows*p.dc, rows*(p.dc+dr)).Reshape(rows, dr)
	sl.KV, sl.PE = kv.Reshape(rows, 1, p.dc), pe
	var ik compute.Tensor
	if p.di > 0 {
		ik = buf.Rows(rows*(p.dc+dr), rows*p.rowLen()).Reshape(rows, p.di)
		sl.IK = ik
	}
	for i := range n {
		pg := &Page{buf: buf, kv: kv.Rows(i*PageSize, (i+1)*PageSize), pe: pe.Rows(i*PageSize, (i+1)*PageSize), slab: sl, index: int32(i)}
		if p.di > 0 {
			pg.ik = ik.Rows(i*PageSize, (i+1)*PageSize)
		}
		sl.pages[i], sl.free[n-1-i] = pg, i
	}
	if p.Account != nil {
		p.Account(int64(n) * p.PageBytes())
	}
	return sl, nil
}

// HeldOnly counts the pages of held that have no holders beyond the
// number held gives for each: the pages that letting go of those holds
// would free.
func (p *Pool) HeldOnly(held map[*Page]int) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for pg, k := range held {
		if pg.refs <= k {
			n++
		}
	}
	return n
}

// share adds a holder to pg.
func (p *Pool) share(pg *Page) {
	p.mu.Lock()
	pg.refs++
	p.mu.Unlock()
}

// release drops a holder of pg, freeing it with the last.
func (p *Pool) release(pg *Page) {
	p.mu.Lock()
	pg.refs--
	last := pg.refs == 0
	if last && pg.slab != nil {
		p.live--
		pg.slab.free = append(pg.slab.free, int(pg.index))
		last = false
	} else if last {
		p.live--
		if len(p.free) < MaxFree {
			p.free = append(p.free, pg)
			last = false
		}
	}
	p.mu.Unlock()
	if last {
		p.destroy(pg)
	}
}

func (p *Pool) shared(pg *Page) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return pg.refs > 1
}

// Cache is one sequence's per-layer cache: the normed latent (Dc), the rope
// key (dr, rotated when RoPE is on) and, for DSA, the index key (DI), one
// row per position, in pages of PageSize positions from a Pool. It grows a
// page at a time up to Limit and truncates in O(1).
type Cache struct {
	pool       *Pool
	pages      []*Page
	pe, ik     []compute.Tensor // the pages' tensors, as the seam takes them
	lat        []compute.Tensor // the pages' latents viewed [PageSize, 1, Dc], attention's key pages
	Len, Limit int
}

// NewCache makes an empty cache of pages from pool, growable to limit
// positions (the model's context length).
func NewCache(pool *Pool, limit int) (*Cache, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("dsa: cache limit %d", limit)
	}
	// Room for four pages' entries before the slices grow.
	return &Cache{pool: pool, Limit: limit, pages: make([]*Page, 0, 4), pe: make([]compute.Tensor, 0, 4),
		ik: make([]compute.Tensor, 0, 4), lat: make([]compute.Tensor, 0, 4)}, nil
}

// Free releases the cache's pages; the cache is empty afterwards.
func (c *Cache) Free() {
	for _, pg := range c.pages {
		c.pool.release(pg)
	}
	clear(c.pages)
	c.pages, c.pe, c.ik, c.lat, c.Len = c.pages[:0], c.pe[:0], c.ik[:0], c.lat[:0], 0
}

// slabTable returns the slab every page of c is in, with the pages'
// places in it appended to table; nil and table unchanged when the pages
// are not all in one slab (or there are none).
func (c *Cache) slabTable(table []int32) (*Slab, []int32) {
	if len(c.pages) == 0 {
		return nil, table
	}
	sl := c.pages[0].slab
	for _, pg := range c.pages {
		if pg.slab == nil || pg.slab != sl {
			return nil, table
		}
	}
	for _, pg := range c.pages {
		table = append(table, pg.index)
	}
	return sl, table
}

// Cap returns the positions the cache's pages hold.
func (c *Cache) Cap() int { return len(c.pages) * PageSize }

// Pages returns the pages the cache holds (shared ones included).
func (c *Cache) Pages() int { return len(c.pages) }

func (c *Cache) push(pg *Page) {
	c.pages = append(c.pages, pg)
	c.pe, c.ik = append(c.pe, pg.pe), append(c.ik, pg.ik)
	c.lat = append(c.lat, pg.kv.Reshape(PageSize, 1, c.pool.dc))
}

// reserve makes room for n more positions: pages up to Len+n, and the page
// the next position falls in copied first if another cache shares it.
func (c *Cache) reserve(n int) error {
	need := c.Len + n
	if need > c.Limit {
		return fmt.Errorf("%w: %d positions exceed the limit of %d", ErrCacheFull, need, c.Limit)
	}
	if n == 0 {
		return nil
	}
	if i := c.Len / PageSize; i < len(c.pages) && c.pool.shared(c.pages[i]) {
		if err := c.unshare(i); err != nil {
			return err
		}
	}
	for c.Cap() < need {
		pg, err := c.pool.alloc()
		if err != nil {
			return err
		}
		c.push(pg)
	}
	return nil
}

// unshare replaces page i by a copy of its first rows (up to Len).
func (c *Cache) unshare(i int) error {
	pg, err := c.pool.alloc()
	if err != nil {
		return err
	}
	old := c.pages[i]
	n := min(PageSize, c.Len-i*PageSize)
	b := c.pool.b
	for _, t := range [][2]compute.Tensor{{pg.kv, old.kv}, {pg.pe, old.pe}, {pg.ik, old.ik}} {
		if !t[0].IsZero() && n > 0 {
			if err := b.Copy(t[0].Rows(0, n), t[1].Rows(0, n)); err != nil {
				c.pool.release(pg)
				return err
			}
		}
	}
	c.pool.release(old)
	c.pages[i], c.pe[i], c.ik[i] = pg, pg.pe, pg.ik
	c.lat[i] = pg.kv.Reshape(PageSize, 1, c.pool.dc)
	return nil
}

// GrowthBytes returns the memory the pool allocates for the cache to take
// n more positions: new pages, and a copy of a shared page it writes into.
func (c *Cache) GrowthBytes(n int) int64 {
	need := c.Len + n
	if n <= 0 || need > c.Limit {
		return 0
	}
	pages := max(0, (need+PageSize-1)/PageSize-len(c.pages))
	if i := c.Len / PageSize; i < len(c.pages) && c.pool.shared(c.pages[i]) {
		pages++
	}
	return int64(pages) * c.pool.PageBytes()
}

// Truncate drops every position from n on (speculative decoding rolls back
// this way); pages past n go back to the pool.
func (c *Cache) Truncate(n int) error {
	if n < 0 || n > c.Len {
		return fmt.Errorf("dsa: truncate to %d of %d positions", n, c.Len)
	}
	c.Len = n
	keep := (n + PageSize - 1) / PageSize
	for _, pg := range c.pages[keep:] {
		c.pool.release(pg)
	}
	clear(c.pages[keep:])
	c.pages, c.pe, c.ik, c.lat = c.pages[:keep], c.pe[:keep], c.ik[:keep], c.lat[:keep]
	return nil
}

// Fork makes c (empty) hold src's positions: the full pages are shared,
// the partial last page is copied.
func (c *Cache) Fork(src *Cache) error {
	if c.pool != src.pool || c.Len != 0 || len(c.pages) != 0 {
		return fmt.Errorf("dsa: forking into a cache of another pool or one in use")
	}
	for _, pg := range src.pages[:(src.Len+PageSize-1)/PageSize] {
		c.pool.share(pg)
		c.push(pg)
	}
	c.Len = src.Len
	if i := c.Len / PageSize; i < len(c.pages) && c.Len%PageSize != 0 {
		return c.unshare(i)
	}
	return nil
}

// Bytes returns the memory of the pages the cache holds (a page shared
// with forks counts in each).
func (c *Cache) Bytes() int64 { return int64(len(c.pages)) * c.pool.PageBytes() }

// AddPages adds the cache's pages to seen and returns the memory of
// those seen did not hold: summed over several caches of one pool, the
// memory of their pages with each shared page once.
func (c *Cache) AddPages(seen map[*Page]bool) int64 {
	n := 0
	for _, pg := range c.pages {
		if !seen[pg] {
			seen[pg] = true
			n++
		}
	}
	return int64(n) * c.pool.PageBytes()
}

// RowLen is the floats one position takes across the cache's tensors
// (latent, rope key, index key), as ReadRows lays them out.
func (c *Cache) RowLen() int { return c.pool.rowLen() }

// segment calls f for each run of positions [a, e) of [lo, hi) within one
// page, with the page's index and the run's first row in it.
func segment(lo, hi int, f func(a, e, page, row int) error) error {
	for a := lo; a < hi; {
		e := min(hi, (a/PageSize+1)*PageSize)
		if err := f(a, e, a/PageSize, a%PageSize); err != nil {
			return err
		}
		a = e
	}
	return nil
}

// ReadRows copies positions [lo, hi) into dst ((hi-lo)·RowLen floats):
// their latent rows, then their rope-key rows, then their index-key rows.
func (c *Cache) ReadRows(dst []float32, lo, hi int) error {
	if lo < 0 || hi < lo || hi > c.Len || len(dst) != (hi-lo)*c.RowLen() {
		return fmt.Errorf("dsa: read positions [%d, %d) of %d into %d floats", lo, hi, c.Len, len(dst))
	}
	n, p := hi-lo, c.pool
	kv, pe, ik := dst[:n*p.dc], dst[n*p.dc:n*(p.dc+max(p.dr, 1))], dst[n*(p.dc+max(p.dr, 1)):]
	return segment(lo, hi, func(a, e, pg, r int) error {
		m, o := e-a, a-lo
		part := kv[o*p.dc : (o+m)*p.dc]
		if err := p.b.Read(&part, c.pages[pg].kv.Rows(r, r+m)); err != nil {
			return err
		}
		part = pe[o*max(p.dr, 1) : (o+m)*max(p.dr, 1)]
		if err := p.b.Read(&part, c.pe[pg].Rows(r, r+m)); err != nil {
			return err
		}
		if p.di > 0 {
			part = ik[o*p.di : (o+m)*p.di]
			return p.b.Read(&part, c.ik[pg].Rows(r, r+m))
		}
		return nil
	})
}

// AppendRows appends n positions from src (n·RowLen floats in ReadRows'
// layout: their latent rows, then rope-key rows, then index-key rows), as
// a saved sequence comes back.
func (c *Cache) AppendRows(src []float32, n int) error {
	p := c.pool
	if n < 0 || len(src) != n*c.RowLen() {
		return fmt.Errorf("dsa: append %d positions from %d floats (want %d)", n, len(src), n*c.RowLen())
	}
	if err := c.reserve(n); err != nil {
		return err
	}
	dr := max(p.dr, 1)
	kv, pe, ik := src[:n*p.dc], src[n*p.dc:n*(p.dc+dr)], src[n*(p.dc+dr):]
	lo := c.Len
	err := segment(lo, lo+n, func(a, e, pg, r int) error {
		m, o := e-a, a-lo
		if err := p.b.Write(c.pages[pg].kv.Rows(r, r+m), kv[o*p.dc:(o+m)*p.dc]); err != nil {
			return err
		}
		if err := p.b.Write(c.pe[pg].Rows(r, r+m), pe[o*dr:(o+m)*dr]); err != nil {
			return err
		}
		if p.di > 0 {
			return p.b.Write(c.ik[pg].Rows(r, r+m), ik[o*p.di:(o+m)*p.di])
		}
		return nil
	})
	if err != nil {
		return err
	}
	c.Len += n
	return nil
}

// write stores rows of the new positions [c.Len, c.Len+n) from contiguous
// tensors (any of them zero is skipped): kv [n, Dc], pe [n, dr], ik [n, DI].
// The cache has room for them (reserve).
func (c *Cache) write(kv, pe, ik compute.Tensor, n int) error {
	b, lo := c.pool.b, c.Len
	return segment(lo, lo+n, func(a, e, pg, r int) error {
		for _, t := range [][2]compute.Tensor{{c.pages[pg].kv, kv}, {c.pe[pg], pe}, {c.ik[pg], ik}} {
			if !t[1].IsZero() && !t[0].IsZero() {
				if err := b.Copy(t[0].Rows(r, r+e-a), t[1].Rows(a-lo, e-lo)); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// gather copies positions [0, n) of one kind (0 latent, 1 rope key) into
// dst [n, width], contiguous.
func (c *Cache) gather(dst compute.Tensor, kind, n int) error {
	return segment(0, n, func(a, e, pg, r int) error {
		src := c.pages[pg].kv
		if kind == 1 {
			src = c.pe[pg]
		}
		return c.pool.b.Copy(dst.Rows(a, e), src.Rows(r, r+e-a))
	})
}

// Hold returns the page that holds position pos, with a reference the
// caller gives back with Pool.Release: positions of it before the
// cache's length then stay as they are, whatever the cache does (a cache
// that writes into a held page copies it first).
func (c *Cache) Hold(pos int) (*Page, error) {
	if pos < 0 || pos >= c.Len {
		return nil, fmt.Errorf("dsa: hold position %d of %d", pos, c.Len)
	}
	pg := c.pages[pos/PageSize]
	c.pool.share(pg)
	return pg, nil
}

// Release gives back a reference Hold took.
func (p *Pool) Release(pg *Page) { p.release(pg) }

// Adopt makes c (empty) hold n positions from pages (held, in order,
// page i holding positions i·PageSize onwards, each valid up to n): the
// full pages are shared, the partial last one is copied.
func (c *Cache) Adopt(pages []*Page, n int) error {
	if c.Len != 0 || len(c.pages) != 0 || n > c.Limit || len(pages) != (n+PageSize-1)/PageSize {
		return fmt.Errorf("dsa: adopt %d positions from %d pages into a cache of %d", n, len(pages), c.Len)
	}
	for _, pg := range pages {
		c.pool.share(pg)
		c.push(pg)
	}
	c.Len = n
	if n%PageSize != 0 {
		return c.unshare(len(c.pages) - 1)
	}
	return nil
}
