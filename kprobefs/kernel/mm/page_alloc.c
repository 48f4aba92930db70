/* Page allocator: a binary buddy system over the RAM the host hands to mem_init(), as
 * Linux's: a free list per order; a freed block merges with its free buddy, so what is
 * freed can be had again at any order.  Pages are reached through the direct map at
 * PAGE_OFFSET; the page map (one struct page a page) sits at the end of the RAM. */
#include "kernel.h"
#include "mm.h"
#include "sched.h"

static struct list_head free_area[MAX_ORDER];
static struct page *mem_map;
static unsigned long mem_base, nr_pages;	/* the first page's address; how many */
static DEFINE_SPINLOCK(zone_lock);
#define DIV_ROUND_UP(n, d) (((n) + (d) - 1) / (d))
unsigned long totalram_pages, nr_free_pages_count;
unsigned long nr_kernel_stack_pages, nr_kmalloc_large_pages, nr_alloc_failures;

struct page *virt_to_page(const void *addr)
{
	return &mem_map[((unsigned long)addr - mem_base) >> PAGE_SHIFT];
}

void *page_address(const struct page *page)
{
	return (void *)(mem_base + ((unsigned long)(page - mem_map) << PAGE_SHIFT));
}

/* Caller holds zone_lock. */
static void add_free(unsigned long idx, unsigned int order)
{
	mem_map[idx].buddy_order = order + 1;
	list_add(&mem_map[idx].lru, &free_area[order]);
}

/* The heap is [start_pa, end_pa), its start 2 MiB aligned (a block of order up to 9 is
 * aligned to its size: thread stacks need that). */
void mem_init(unsigned long start_pa, unsigned long end_pa)
{
	unsigned long start = (unsigned long)__va(ALIGN(start_pa, PAGE_SIZE));
	unsigned long end = (unsigned long)__va(end_pa & ~(PAGE_SIZE - 1));
	unsigned long map_pages, idx;
	unsigned int order;

	for (order = 0; order < MAX_ORDER; order++)
		INIT_LIST_HEAD(&free_area[order]);
	nr_pages = (end - start) >> PAGE_SHIFT;
	map_pages = DIV_ROUND_UP(nr_pages * sizeof(struct page), PAGE_SIZE + sizeof(struct page));
	nr_pages -= map_pages;
	mem_base = start;
	mem_map = (struct page *)(start + (nr_pages << PAGE_SHIFT));
	totalram_pages = nr_pages;
	nr_free_pages_count = nr_pages;
	for (idx = 0; idx < nr_pages; idx += 1UL << order) {
		order = MAX_ORDER - 1;
		while ((idx & ((1UL << order) - 1)) || idx + (1UL << order) > nr_pages)
			order--;
		add_free(idx, order);
	}
}

/* warn_alloc(): Linux's allocation-failure report, at most ten every five seconds. */
static void warn_alloc(gfp_t gfp, unsigned int order)
{
	static unsigned long window_start;
	static int printed;

	nr_alloc_failures++;
	if (gfp & __GFP_NOWARN)
		return;
	if (jiffies - window_start > 5 * HZ) {
		window_start = jiffies;
		printed = 0;
	}
	if (printed++ >= 10)
		return;
	printk(KERN_WARNING "%s: page allocation failure: order:%u, mode:%#x(%s), "
	       "nodemask=(null)\n", current->comm, order, gfp,
	       gfp == GFP_KERNEL ? "GFP_KERNEL" :
	       gfp == (GFP_KERNEL | __GFP_ZERO) ? "GFP_KERNEL|__GFP_ZERO" : "");
	printk(KERN_WARNING "CPU: %d PID: %d Comm: %.16s\n", smp_processor_id(),
	       current->pid, current->comm);
	printk(KERN_INFO "Mem-Info:\n");
	printk(KERN_INFO "Node 0 Normal free:%lukB managed:%lukB\n",
	       nr_free_pages_count << (PAGE_SHIFT - 10), totalram_pages << (PAGE_SHIFT - 10));
}

struct page *alloc_pages(gfp_t gfp, unsigned int order)
{
	struct page *page = NULL;
	unsigned int k;
	unsigned long idx;

	if (order < MAX_ORDER) {
		spin_lock(&zone_lock);
		for (k = order; k < MAX_ORDER && list_empty(&free_area[k]); k++)
			;
		if (k < MAX_ORDER) {
			page = list_first_entry(&free_area[k], struct page, lru);
			list_del_init(&page->lru);
			page->buddy_order = 0;
			idx = page - mem_map;
			while (k > order) {	/* give back the upper halves */
				k--;
				add_free(idx + (1UL << k), k);
			}
			nr_free_pages_count -= 1UL << order;
		}
		spin_unlock(&zone_lock);
	}
	if (!page) {
		warn_alloc(gfp, order);
		return NULL;
	}
	if (gfp & __GFP_ZERO)
		memset(page_address(page), 0, PAGE_SIZE << order);
	return page;
}

void __free_pages(struct page *page, unsigned int order)
{
	unsigned long idx = page - mem_map, buddy;

	spin_lock(&zone_lock);
	nr_free_pages_count += 1UL << order;
	while (order < MAX_ORDER - 1) {
		buddy = idx ^ (1UL << order);
		if (buddy + (1UL << order) > nr_pages || mem_map[buddy].buddy_order != order + 1)
			break;
		list_del_init(&mem_map[buddy].lru);
		mem_map[buddy].buddy_order = 0;
		idx &= ~(1UL << order);
		order++;
	}
	add_free(idx, order);
	spin_unlock(&zone_lock);
}

void *alloc_pages_exact(size_t size, gfp_t gfp)
{
	struct page *page = alloc_pages(gfp, get_order(size));

	return page ? page_address(page) : NULL;
}

void free_pages_exact(void *addr, size_t size)
{
	if (addr)
		__free_pages(virt_to_page(addr), get_order(size));
}
