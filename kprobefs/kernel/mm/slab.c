/* kmalloc: power-of-two size classes carved from pages, with a header recording the
 * class so kfree() needs no size. */
#include "kernel.h"
#include "trace/events/kmem.h"

#define KMALLOC_MIN_SHIFT 5
#define KMALLOC_MAX_SHIFT 12
#define NR_KMALLOC (KMALLOC_MAX_SHIFT - KMALLOC_MIN_SHIFT + 1)

struct kmem_cache {
	const char *name;
	unsigned int size;
	void *freelist;
	unsigned long nr_allocated;
	spinlock_t lock;
};

struct slab_header {
	u32 shift;		/* object class, or 0 for a page allocation */
	u32 magic;
	u64 pages_size;
};
#define SLAB_MAGIC 0x51ab51abu

static struct kmem_cache kmalloc_caches[NR_KMALLOC];
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
	}
}

static int kmalloc_index(size_t size)
{
	int shift = KMALLOC_MIN_SHIFT;

	while ((1UL << shift) < size)
		shift++;
	return shift;
}

static void cache_grow(struct kmem_cache *s)
{
	char *page = alloc_pages_exact(PAGE_SIZE, 0);
	unsigned int n, i;

	if (!page)
		return;
	n = PAGE_SIZE / s->size;
	for (i = 0; i < n; i++) {
		void **obj = (void **)(page + i * s->size);

		*obj = s->freelist;
		s->freelist = obj;
	}
}

static void *slab_alloc(struct kmem_cache *s)
{
	void **obj;

	spin_lock(&s->lock);
	if (!s->freelist)
		cache_grow(s);
	obj = s->freelist;
	if (obj) {
		s->freelist = *obj;
		s->nr_allocated++;
	}
	spin_unlock(&s->lock);
	return obj;
}

static void *__kmalloc(size_t size, gfp_t flags, unsigned long caller)
{
	size_t total = size + sizeof(struct slab_header);
	size_t alloc;
	struct slab_header *h;
	int shift;

	if (total > (1UL << KMALLOC_MAX_SHIFT)) {
		h = alloc_pages_exact(total, 0);
		if (!h)
			goto fail;
		h->shift = 0;
		h->pages_size = total;
		alloc = total - sizeof(*h);
	} else {
		shift = kmalloc_index(total);
		h = slab_alloc(&kmalloc_caches[shift - KMALLOC_MIN_SHIFT]);
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
	struct kmem_cache *s;

	trace_kfree(_RET_IP_, p);
	if (!p)
		return;
	h = (struct slab_header *)p - 1;
	BUG_ON(h->magic != SLAB_MAGIC);
	h->magic = 0;
	if (!h->shift) {
		free_pages_exact(h, h->pages_size);
		return;
	}
	s = &kmalloc_caches[h->shift - KMALLOC_MIN_SHIFT];
	spin_lock(&s->lock);
	*(void **)h = s->freelist;
	s->freelist = h;
	s->nr_allocated--;
	spin_unlock(&s->lock);
}

char *kstrdup(const char *s, gfp_t gfp)
{
	size_t len = strlen(s) + 1;
	char *p = __kmalloc(len, gfp, _RET_IP_);

	if (p)
		memcpy(p, s, len);
	return p;
}
