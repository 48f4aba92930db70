/* kmalloc: power-of-two size classes carved from pages, with a header recording the
 * class so kfree() needs no size.  Each slab page keeps its own free objects (in its
 * struct page, as SLUB does); a page whose objects are all free goes back to the page
 * allocator, but for one kept per cache for the next allocation. */
#include "kernel.h"
#include "mm.h"
#include "trace/events/kmem.h"

struct slab_header {
	u32 shift;		/* object class, or 0 for a page allocation */
	u32 magic;
	u64 pages_size;
};
#define SLAB_MAGIC 0x51ab51abu
/* Empty slabs a cache keeps rather than give back. */
#define SLAB_MIN_EMPTY 1

struct kmem_cache kmalloc_caches[NR_KMALLOC];
static const char *const kmalloc_names[NR_KMALLOC] = {
	"kmalloc-32", "kmalloc-64", "kmalloc-128", "kmalloc-256",
	"kmalloc-512", "kmalloc-1k", "kmalloc-2k", "kmalloc-4k",
};

void kmem_cache_init(void)
{
	int i;

	for (i = 0; i < NR_KMALLOC; i++) {
		kmalloc_caches[i].name = kmalloc_names[i];
		kmalloc_caches[i].size = 1u << (i + KMALLOC_MIN_SHIFT);
		kmalloc_caches[i].objs_per_slab = PAGE_SIZE >> (i + KMALLOC_MIN_SHIFT);
		INIT_LIST_HEAD(&kmalloc_caches[i].partial);
	}
}

static int kmalloc_index(size_t size)
{
	int shift = KMALLOC_MIN_SHIFT;

	while ((1UL << shift) < size)
		shift++;
	return shift;
}

/* A new slab on the partial list, or false when the page allocator has no page.
 * Caller holds s->lock. */
static bool cache_grow(struct kmem_cache *s, gfp_t gfp)
{
	struct page *page = alloc_pages(gfp & ~__GFP_ZERO, 0);
	char *base;
	unsigned int i;

	if (!page)
		return false;
	base = page_address(page);
	page->freelist = NULL;
	for (i = s->objs_per_slab; i-- > 0;) {
		void **obj = (void **)(base + i * s->size);

		*obj = page->freelist;
		page->freelist = obj;
	}
	page->inuse = 0;
	page->slab = 1;
	list_add(&page->lru, &s->partial);
	s->nr_slabs++;
	s->nr_empty++;
	return true;
}

static void *slab_alloc(struct kmem_cache *s, gfp_t gfp)
{
	struct page *page;
	void **obj = NULL;

	spin_lock(&s->lock);
	if (!list_empty(&s->partial) || cache_grow(s, gfp)) {
		page = list_first_entry(&s->partial, struct page, lru);
		obj = page->freelist;
		page->freelist = *obj;
		if (!page->inuse++)
			s->nr_empty--;
		if (!page->freelist)
			list_del_init(&page->lru);	/* full */
		s->nr_active++;
	}
	spin_unlock(&s->lock);
	return obj;
}

static void slab_free(struct kmem_cache *s, void *obj)
{
	struct page *page = virt_to_page(obj);

	spin_lock(&s->lock);
	if (!page->freelist)
		list_add(&page->lru, &s->partial);	/* was full */
	*(void **)obj = page->freelist;
	page->freelist = obj;
	s->nr_active--;
	if (!--page->inuse) {
		if (s->nr_empty >= SLAB_MIN_EMPTY) {
			list_del_init(&page->lru);
			page->slab = 0;
			s->nr_slabs--;
			spin_unlock(&s->lock);
			__free_pages(page, 0);
			return;
		}
		s->nr_empty++;
	}
	spin_unlock(&s->lock);
}

static void *__kmalloc(size_t size, gfp_t flags, unsigned long caller)
{
	size_t total = size + sizeof(struct slab_header);
	size_t alloc;
	struct slab_header *h;
	int shift;

	if (total > (1UL << KMALLOC_MAX_SHIFT)) {
		h = alloc_pages_exact(total, flags & ~__GFP_ZERO);
		if (!h)
			goto fail;
		h->shift = 0;
		h->pages_size = total;
		alloc = total - sizeof(*h);
		__atomic_add_fetch(&nr_kmalloc_large_pages, 1UL << get_order(total), __ATOMIC_RELAXED);
	} else {
		shift = kmalloc_index(total);
		h = slab_alloc(&kmalloc_caches[shift - KMALLOC_MIN_SHIFT], flags);
		if (!h)
			goto fail;
		h->shift = shift;
		alloc = (1UL << shift) - sizeof(*h);
	}
	h->magic = SLAB_MAGIC;
	if (flags & __GFP_ZERO)
		memset(h + 1, 0, size);
	trace_kmalloc(caller, h + 1, size, alloc, flags, NUMA_NO_NODE);
	return h + 1;
fail:
	trace_kmalloc(caller, NULL, size, 0, flags, NUMA_NO_NODE);
	return NULL;
}

/* The call site the kmem events report is kmalloc's caller (_RET_IP_), as Linux's
 * inline kmalloc makes it. */
void *kmalloc(size_t size, gfp_t flags)
{
	return __kmalloc(size, flags, _RET_IP_);
}

void *kzalloc(size_t size, gfp_t flags)
{
	return __kmalloc(size, flags | __GFP_ZERO, _RET_IP_);
}

void kfree(const void *p)
{
	struct slab_header *h;

	trace_kfree(_RET_IP_, p);
	if (!p)
		return;
	h = (struct slab_header *)p - 1;
	BUG_ON(h->magic != SLAB_MAGIC);
	h->magic = 0;
	if (!h->shift) {
		__atomic_sub_fetch(&nr_kmalloc_large_pages, 1UL << get_order(h->pages_size),
				   __ATOMIC_RELAXED);
		free_pages_exact(h, h->pages_size);
		return;
	}
	slab_free(&kmalloc_caches[h->shift - KMALLOC_MIN_SHIFT], h);
}

char *kstrdup(const char *s, gfp_t gfp)
{
	size_t len = strlen(s) + 1;
	char *p = __kmalloc(len, gfp, _RET_IP_);

	if (p)
		memcpy(p, s, len);
	return p;
}
