export async function jobMareyPage(): Promise<void> {}
