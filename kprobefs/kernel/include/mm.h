/* The page allocator's and kmalloc's structures, shared with the host's map of kernel
 * structures (init/main.c's kabi: /proc/meminfo and /proc/slabinfo read them). */
#ifndef _MM_H
#define _MM_H
#include "kernel.h"

#define MAX_ORDER 11

/* One per page of the heap, as Linux's struct page: a free block's head keeps its
 * order here (order + 1; 0: not a free head); a slab page its free objects. */
struct page {
	struct list_head lru;		/* free_area list, or its cache's partial list */
	void *freelist;			/* slab: the page's free objects */
	unsigned int inuse;		/* slab: objects handed out */
	unsigned short buddy_order;	/* order + 1 while the head of a free block */
	unsigned short slab;		/* 1 while a slab page */
};

struct kmem_cache {
	const char *name;
	unsigned int size;		/* object size, its header included */
	unsigned int objs_per_slab;
	struct list_head partial;	/* slabs with a free object (full ones are on none) */
	unsigned long nr_slabs;		/* pages the cache holds */
	unsigned long nr_active;	/* objects handed out */
	unsigned long nr_empty;		/* slabs with none handed out, kept for the next */
	spinlock_t lock;
};

#define KMALLOC_MIN_SHIFT 5
#define KMALLOC_MAX_SHIFT 12
#define NR_KMALLOC (KMALLOC_MAX_SHIFT - KMALLOC_MIN_SHIFT + 1)
extern struct kmem_cache kmalloc_caches[NR_KMALLOC];

static inline unsigned int get_order(size_t size)
{
	unsigned int order = 0;

	size = (size - 1) >> PAGE_SHIFT;
	while (size) {
		order++;
		size >>= 1;
	}
	return order;
}

struct page *virt_to_page(const void *addr);
void *page_address(const struct page *page);
struct page *alloc_pages(gfp_t gfp, unsigned int order);
void __free_pages(struct page *page, unsigned int order);

/* What /proc/meminfo shows, in pages; allocation failures since boot. */
extern unsigned long nr_kernel_stack_pages, nr_kmalloc_large_pages, nr_alloc_failures;

#endif
